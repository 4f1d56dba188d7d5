"""Per-check results: status, examples tried and exercising, path coverage, time, violations."""

from __future__ import annotations

from collections import Counter
from typing import Literal

import attrs

from specproof.contract import Violation

__all__ = ["CheckResult", "Status"]

Status = Literal["pending", "pass", "excused", "fail", "skip", "error", "xfail", "xpass"]


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

    def to_json(self) -> dict[str, object]:
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
        }
