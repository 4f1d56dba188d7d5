"""Per-test results collected while certifying: status, examples tried, time, violations."""

from __future__ import annotations

from typing import Literal

import attrs

from specproof.conformance._invariants import Violation

__all__ = ["CheckResult", "Recorder", "Status"]

Status = Literal["pass", "excused", "fail", "skip", "error"]


@attrs.define
class CheckResult:
    nodeid: str
    invariant: str  # an invariant id, or "stateful.rollback-machine"
    case: str  # which subject configuration ("checkpoint", "replay", the plug-in, "drafter", "target")
    status: Status = "pass"
    examples: int = 0
    seconds: float = 0.0
    violations: list[Violation] = attrs.Factory(list)
    detail: str = ""
    excused: int = 0
    excused_margins: list[float] = attrs.Factory(list)
    reproduce: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "invariant": self.invariant,
            "case": self.case,
            "status": self.status,
            "examples": self.examples,
            "seconds": round(self.seconds, 4),
            "detail": self.detail,
            "excused": {"count": self.excused, "margins": self.excused_margins} if self.excused else None,
            "violations": [v.to_json() for v in self.violations],
            "reproduce": self.reproduce or None,
            "pytest_id": self.nodeid,
        }


class Recorder:
    """Where a running certifying test records what it tried; keyed by pytest node id."""

    def __init__(self) -> None:
        self.results: dict[str, CheckResult] = {}

    def get(self, nodeid: str, invariant: str, case: str) -> CheckResult:
        if nodeid not in self.results:
            self.results[nodeid] = CheckResult(nodeid=nodeid, invariant=invariant, case=case)
        return self.results[nodeid]
