"""For specproof's own command line (``specproof bench``): not public API.

The CLI may import no private module of another package (``tests/project/test_layers.py``), so
what only it needs from the bench (the size of a plan for the progress bar, and a result
rendered as text) is named here rather than in the ``specproof.bench`` facade. Like a private
module, this one may change in any commit (docs/contract.md, "Stability"): parse the JSON
result (``specproof.formats.bench``), never the text.
"""

from specproof.bench._acceptance import acceptance_k, acceptance_lines, finding_line
from specproof.bench._drafter_run import drafter_plan_size
from specproof.bench._gate import CPU_KINDS
from specproof.bench._pipeline import plan_size
from specproof.bench._render import (
    batch_lines,
    degeneracy_label,
    drafter_table_lines,
    peer_lines,
    real_context_lines,
    sampled_context_lines,
    tree_lines,
)

__all__ = [
    "batch_lines",
    "CPU_KINDS",
    "acceptance_k",
    "acceptance_lines",
    "drafter_plan_size",
    "finding_line",
    "degeneracy_label",
    "drafter_table_lines",
    "peer_lines",
    "plan_size",
    "real_context_lines",
    "sampled_context_lines",
    "tree_lines",
]
