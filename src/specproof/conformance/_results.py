"""Per-check results: status, examples tried and exercising, path coverage, time, violations."""

from __future__ import annotations

from collections import Counter
from typing import Literal

import attrs

from specproof.contract import Violation

__all__ = ["CheckResult", "Status"]

Status = Literal["pending", "pass", "excused", "fail", "skip", "error", "xfail", "xpass", "consequence"]


@attrs.define
class CheckResult:
    """The verdict of one check on one subject case.

    ``examples`` counts the examples tried, ``exercised`` what of them reached the check
    (calls compared, rounds checked, generations completed): a check passes only with
    ``exercised > 0``; with none it is a ``skip`` and ``detail`` says why.
    """

    nodeid: str
    invariant: str
    case: str
    status: Status = "pending"
    examples: int = 0
    exercised: int = 0
    seconds: float = 0.0
    violations: list[Violation] = attrs.Factory(list)
    detail: str = ""
    excused: int = 0
    excused_margins: list[float] = attrs.Factory(list)
    paths: Counter[str] = attrs.Factory(Counter)
    notes: list[str] = attrs.Factory(list)
    reproduce: str = ""
    expected_failure: str | None = None  # the declared reason, when --expect-fail names this invariant
    # the checks of another subject whose failure caused this one's (status "consequence"): told once, there
    consequence_of: tuple[str, ...] = ()

    def fail(self, violations: list[Violation]) -> None:
        self.status = "fail"
        self.violations = list(violations)
        self.detail = str(self.violations[0]).splitlines()[0] if self.violations else "failed"

    def skip(self, reason: str) -> None:
        self.status = "skip"
        self.detail = reason

    def settle(self) -> None:
        """A check that found nothing wrong: pass (or excused) if it exercised something, else skip."""
        if not self.exercised:
            self.skip(self.detail or "no example reached this check")
        elif self.excused:
            self.status = "excused"
            lo, hi = min(self.excused_margins, default=0), max(self.excused_margins, default=0)
            self.detail = f"{self.excused} excused divergence(s), top-2 margins {lo:.3g}..{hi:.3g}"
        else:
            self.status = "pass"

    def expect_failure(self, reason: str) -> None:
        """Apply a declared expected failure: ``fail`` becomes ``xfail``, a pass ``xpass`` (strict)."""
        self.expected_failure = reason
        if self.status == "fail":
            self.status = "xfail"
            self.detail = f"expected failure ({reason}): {self.detail}"
        elif self.status in ("pass", "excused"):
            self.status = "xpass"
            self.detail = f"declared an expected failure ({reason}) but passed: remove the declaration"

    def mark_consequence(self, causes: tuple[str, ...]) -> None:
        """A failure caused by a subject that failed its own checks (``causes``): reported there, counted here."""
        if self.status not in ("fail", "error"):
            return
        self.status = "consequence"
        self.consequence_of = tuple(causes)
        self.detail = f"consequence of {', '.join(causes)} (the drafter's failure): {self.detail}"

    def to_json(self) -> dict[str, object]:
        extra: dict[str, object] = {"consequence_of": list(self.consequence_of)} if self.consequence_of else {}
        return {
            "id": self.nodeid,
            "invariant": self.invariant,
            "case": self.case,
            "status": self.status,
            "examples": self.examples,
            "exercised": self.exercised,
            "seconds": round(self.seconds, 4),
            "detail": self.detail,
            "notes": list(self.notes),
            "excused": {"count": self.excused, "margins": self.excused_margins} if self.excused else None,
            "violations": [v.to_json() for v in self.violations],
            "reproduce": self.reproduce or None,
            "expected_failure": self.expected_failure,
            **extra,
        }
