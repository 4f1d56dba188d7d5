"""One failure told once: engine checks that failed because the drafter under certification failed.

The built-in engine cases decode with the drafter being certified. When that drafter fails one of
its own checks (``drafter.max-length``: it returns k+1 tokens), every engine check run with it
fails too, each with the same message: the one failure that matters is buried under a score of
copies. Those engine results become ``consequence`` (their violations kept in the report, each
with ``consequence_of`` naming the drafter checks), counted in the verdict reason, not repeated
as failure blocks. The verdict stays FAIL: the drafter's own failure is still there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._certification import Certification

__all__ = ["mark_consequences"]


def mark_consequences(cert: Certification) -> tuple[str, ...]:
    """Mark the engine results caused by a failed certified drafter; returns the drafter checks that
    failed (empty when nothing was marked). Idempotent: a second call marks nothing new."""
    suite = cert.plan.suite
    if not suite.certify_drafter:
        return ()
    roots = tuple(
        sorted({r.invariant for r in cert.results.values() if r.case == "drafter" and r.status in ("fail", "error")})
    )
    if not roots:
        return ()
    # the cases that decode with the certified drafter: the built-in engine (a plug-in engine drafts
    # with its own drafter or the suite's scripted one, so its failures are its own)
    with_drafter = {c.id for c in suite.engines if c.kind == "builtin"}
    builtin = [c.id for c in suite.engines if c.kind == "builtin"]
    with_drafter.add("+".join(builtin))  # the rollback machine's case over every built-in strategy
    for result in cert.results.values():
        if result.case in with_drafter and result.status in ("fail", "error"):
            result.mark_consequence(roots)
    return roots
