"""specproof.bench: the benchmark workloads, the figures, the speed gate and the plot.

``run_bench(BenchConfig.quick())`` measures (``drafter_table_lines`` and ``peer_lines`` render the
drafter comparison and the peer rows of a result as text); ``save_baseline``/``load_baseline`` and
``compare`` gate a run against a committed baseline; ``plot_result`` draws speedup vs
k. ``specproof bench`` is the command-line front end (docs/bench.md).
"""

from specproof.bench._gate import (
    BASELINE_SCHEMA,
    MEAN_RATIO_TOLERANCE,
    MI_TOLERANCE,
    RATIO_TOLERANCE,
    BaselineError,
    Finding,
    GateReport,
    compare,
    figures,
    load_baseline,
    make_baseline,
    save_baseline,
    validate_baseline,
)
from specproof.bench._measure import (
    DEFAULT_TARGET,
    DRAFTER_COMPARISON,
    MOE_COMPANION,
    BenchConfig,
    BenchResult,
    Cell,
    CountingTarget,
    DrafterCell,
    comparison_drafter,
    drafter_table_lines,
    peer_lines,
    plan_size,
    platform_info,
    run_bench,
)
from specproof.bench._plot import plot_result
from specproof.bench._workloads import WORKLOAD_NAMES, Workload, build_workloads, encode_text, stdlib_token_stream

__all__ = [
    "BASELINE_SCHEMA",
    "DEFAULT_TARGET",
    "DRAFTER_COMPARISON",
    "MEAN_RATIO_TOLERANCE",
    "MI_TOLERANCE",
    "MOE_COMPANION",
    "RATIO_TOLERANCE",
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
    "drafter_table_lines",
    "encode_text",
    "figures",
    "load_baseline",
    "make_baseline",
    "peer_lines",
    "plan_size",
    "platform_info",
    "plot_result",
    "run_bench",
    "save_baseline",
    "stdlib_token_stream",
    "validate_baseline",
]
