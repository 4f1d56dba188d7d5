"""specproof.conformance.checks: the invariant checks, each returning ``list[Violation]``.

Every check takes the registry ``Invariant`` it implements as its first argument
(``specproof.conformance.get(id)``) and builds its violations through it; the registry
says where each applies and runs it over a run record (docs/contract.md, "the registry").

This module is the public facade; the checks live in submodules:

- ``generation`` — per-generation checks over an engine's records (no target needed):
  accept bounds and rule, KV length, stopping, cost, trace consistency;
- ``lossless`` — the tie-aware ``engine.lossless`` verdict;
- ``drafter`` / ``target`` — checks that drive a drafter or a target directly.
"""

from specproof.conformance.checks.drafter import (
    check_deterministic,
    check_max_length,
    check_no_mutation,
    check_token_range,
)
from specproof.conformance.checks.generation import (
    check_accept_bounds,
    check_accept_rule,
    check_cost,
    check_kv_length,
    check_stop,
    check_trace_consistency,
)
from specproof.conformance.checks.target import (
    check_capacity,
    check_causality,
    check_checkpoints,
    check_chunk_invariance,
    check_processed,
    check_restore,
    check_shape,
    compare_logits,
    compare_states,
)
from specproof.contract.lossless import (
    LosslessStatus,
    LosslessVerdict,
    VerdictSummary,
    compare_lossless,
    summarise_verdicts,
)

__all__ = [
    "check_capacity",
    "check_causality",
    "check_checkpoints",
    "check_chunk_invariance",
    "check_deterministic",
    "check_max_length",
    "check_no_mutation",
    "check_processed",
    "check_restore",
    "check_shape",
    "check_token_range",
    "compare_logits",
    "compare_states",
    "LosslessStatus",
    "LosslessVerdict",
    "VerdictSummary",
    "check_accept_bounds",
    "check_accept_rule",
    "check_cost",
    "check_kv_length",
    "check_stop",
    "check_trace_consistency",
    "compare_lossless",
    "summarise_verdicts",
]
