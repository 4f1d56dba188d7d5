"""A PASS that never speculated: an engine case in which no speculative round was observed.

A speculative-decoding gate that passes an engine whose every path-coverage cell is 0 (a black-box
engine that reports no steps and no drafted tokens, or one that never drafts) has certified plain
greedy decoding, not speculation. Such a plug-in engine case makes the verdict INCONCLUSIVE, with
the reason, unless the engine states it is not speculative: ``speculative = False`` on the engine
(docs/contract.md, "Engines"), which the certificate then records as a note.

A round is speculative when its draft was not empty: the path-coverage paths ``all_accepted``,
``partial``, ``rejected_at_0`` and ``eos_in_accepted``; a black-box engine shows its drafts through
``Generation.stats.drafted``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._certification import Certification

__all__ = [
    "DRAFTING_PATHS",
    "declares_not_speculative",
    "not_speculative_notes",
    "unspeculated_cases",
    "what_was_seen",
]

DRAFTING_PATHS: Final = ("all_accepted", "partial", "rejected_at_0", "eos_in_accepted")


def declares_not_speculative(engine: object) -> bool:
    """The engine says it does not speculate: ``speculative`` is exactly ``False``."""
    return getattr(engine, "speculative", None) is False


def unspeculated_cases(cert: Certification) -> dict[str, str]:
    """Plug-in engine cases that completed generations without one observed speculative round, and did
    not declare ``speculative = False``: case id -> what was observed."""
    coverage = cert.path_coverage()
    out: dict[str, str] = {}
    for case in cert.plan.suite.engines:
        row = coverage.get(case.id)
        if case.kind != "plugin" or not row or not row["completed"] or declares_not_speculative(case.engine):
            continue
        if any(row[p] for p in DRAFTING_PATHS):
            continue
        generations = [run.record.generation for run in cert.runs_of(case) if run.record is not None]
        stats = [g.stats for g in generations if g.stats is not None]
        if sum(st.drafted for st in stats):
            continue
        out[case.id] = what_was_seen(row["completed"], with_steps=any(g.steps for g in generations), stats=len(stats))
    return out


def what_was_seen(completed: int, *, with_steps: bool, stats: int) -> str:
    """What an unspeculated case showed: its rounds if it reports steps, else its stats, or that it has neither
    (a black box without stats is not told "0 drafted tokens": it reported none, so say what to add)."""
    rounds = "0 rounds with a draft" if with_steps else "no rounds (it returns no steps)"
    if stats:
        return f"{completed} generations, {rounds}, 0 drafted tokens in the stats of {stats}"
    return (
        f"{completed} generations, {rounds} and no stats (Generation.stats is None); return "
        "Stats(drafted=..., accepted=...) from generate to show what it drafted"
    )


def not_speculative_notes(cert: Certification) -> dict[str, str]:
    """The note each case that declares ``speculative = False`` gets in its certificate."""
    return {
        case.id: "the engine declares speculative = False: certified as a plain greedy engine (lossless, stop, "
        "capacity); no speculative round was required"
        for case in cert.plan.suite.engines
        if case.kind == "plugin" and declares_not_speculative(case.engine)
    }
