"""specproof.bench: the benchmark workloads, the figures, the speed gate and the plot.

``run_bench(BenchConfig.quick())`` measures; ``run_drafter_bench`` measures one drafter's acceptance
(``specproof bench --drafter``; ``resolve_drafter_target`` settles its target first, and
``check_acceptance_baseline`` refuses a baseline that cannot gate it); ``save_baseline``/``load_baseline``
(a bad file is a ``BaselineError``) and ``compare`` gate a run against a committed baseline;
``plot_result`` draws speedup vs k. ``specproof bench`` is the command-line front end (docs/bench.md);
what only it needs (a result rendered as text) is in ``cli_support``, which is not API.
"""

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from specproof.bench._acceptance import ACCEPTANCE_TOLERANCE, REAL_WORKLOAD, acceptance_figures
from specproof.bench._config import DEFAULT_TARGET, DRAFTER_COMPARISON, MOE_COMPANION, OPTIONAL_DRAFTERS, BenchConfig
from specproof.bench._counting import CountingTarget
from specproof.bench._degeneracy import DEGENERATE_SHARE, distinct_ngram_share, final_period
from specproof.bench._drafter_run import resolve_drafter_target, run_drafter_bench
from specproof.bench._drafters import comparison_drafter, resolve_drafters
from specproof.bench._gate import (
    BASELINE_SCHEMA,
    CPU_POOLED_TOLERANCE,
    CPU_RATIO_TOLERANCE,
    MEAN_RATIO_TOLERANCE,
    MI_TOLERANCE,
    RATIO_TOLERANCE,
    WALL_KINDS,
    BaselineError,
    Finding,
    GateReport,
    check_acceptance_baseline,
    compare,
    figures,
    load_baseline,
    make_baseline,
    save_baseline,
    validate_baseline,
)
from specproof.bench._pipeline import run_bench
from specproof.bench._plot import plot_result
from specproof.bench._real import RealContextCell
from specproof.bench._records import BenchResult, Cell, DrafterCell, platform_info
from specproof.bench._sampled import SAMPLED_SEED, SAMPLED_TEMPERATURES, SampledContextCell
from specproof.bench._workloads import WORKLOAD_NAMES, Workload, build_workloads, encode_text, stdlib_token_stream
from specproof.bench._wrong_head import ChainedHead, mtp_chain_reads_output, mtp_chain_reads_target

__all__ = [
    "ACCEPTANCE_TOLERANCE",
    "BASELINE_SCHEMA",
    "REAL_WORKLOAD",
    "ChainedHead",
    "acceptance_figures",
    "check_acceptance_baseline",
    "mtp_chain_reads_output",
    "mtp_chain_reads_target",
    "resolve_drafter_target",
    "run_drafter_bench",
    "CPU_POOLED_TOLERANCE",
    "CPU_RATIO_TOLERANCE",
    "DEGENERATE_SHARE",
    "OPTIONAL_DRAFTERS",
    "RealContextCell",
    "SAMPLED_SEED",
    "SAMPLED_TEMPERATURES",
    "SampledContextCell",
    "distinct_ngram_share",
    "final_period",
    "resolve_drafters",
    "DEFAULT_TARGET",
    "DRAFTER_COMPARISON",
    "MEAN_RATIO_TOLERANCE",
    "MI_TOLERANCE",
    "MOE_COMPANION",
    "RATIO_TOLERANCE",
    "WALL_KINDS",
    "WORKLOAD_NAMES",
    "BaselineError",
    "BenchConfig",
    "BenchResult",
    "Cell",
    "CountingTarget",
    "DrafterCell",
    "Finding",
    "GateReport",
    "Workload",
    "build_workloads",
    "compare",
    "comparison_drafter",
    "encode_text",
    "figures",
    "load_baseline",
    "make_baseline",
    "platform_info",
    "plot_result",
    "run_bench",
    "save_baseline",
    "stdlib_token_stream",
    "validate_baseline",
]


#: Names this facade exported in 0.1.0 that only ``specproof bench`` needs (a result as text): they
#: still resolve, with a ``DeprecationWarning`` (docs/contract.md, "Deprecation rule").
_DEPRECATED = ("degeneracy_label", "drafter_table_lines", "peer_lines", "plan_size", "real_context_lines")

if not TYPE_CHECKING:  # type checkers see the names as gone, which they are from the facade

    def __getattr__(name: str) -> Any:
        if name not in _DEPRECATED:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"specproof.bench.{name} is deprecated and will be removed (it was for `specproof bench`'s "
            "text output): read the JSON result (`specproof bench --json FILE`, specproof.formats.bench)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module("specproof.bench.cli_support"), name)
