"""For specproof's own command line (``specproof._cli``): not public API.

The CLI may import no private module of another package (``tests/project/test_layers.py``), so
what only it needs from the certify core (the shared options and their argparse wiring, the
example database, fuzz campaigns, the registry rendered for ``specproof invariants``) is named
here rather than in the ``specproof.conformance`` facade. Like a private module, this one may
change in any commit (docs/contract.md, "Stability"): from Python, use ``certify``.
"""

from specproof.conformance._campaign import CampaignOptions, max_workers, run_campaign
from specproof.conformance._database import check_storage, default_examples_dir, open_database, storage_dir
from specproof.conformance._options import SUBJECT_OPTIONS, add_to_argparse, plan_arguments
from specproof.conformance._pytest_run import certify as run_plan
from specproof.conformance._registry import markdown_table, registry_json

__all__ = [
    "SUBJECT_OPTIONS",
    "CampaignOptions",
    "add_to_argparse",
    "check_storage",
    "default_examples_dir",
    "markdown_table",
    "max_workers",
    "open_database",
    "plan_arguments",
    "registry_json",
    "run_campaign",
    "run_plan",
    "storage_dir",
]
