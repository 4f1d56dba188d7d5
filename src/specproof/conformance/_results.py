"""Results: per check (status, examples tried and exercising, paths, time, violations) and the report.

``CheckResult`` is one check's verdict; ``Report`` is what ``certify()`` returns: the
verdict, the results and the path coverage as typed fields, and the report (``specproof.formats.report``)
document they came from (``to_json()``, unchanged).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs

from specproof.contract import Violation

__all__ = ["CheckResult", "Report", "Status"]

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
    # the request relations reached (``REQUEST_COVERAGE`` tags; an applicable one never reached is at 0)
    relations: Counter[str] = attrs.Factory(Counter)
    notes: list[str] = attrs.Factory(list)
    reproduce: str = ""
    expected_failure: str | None = None  # the declared reason, when --expect-fail names this invariant
    # the checks of another subject whose failure caused this one's (status "consequence"): told once, there
    consequence_of: tuple[str, ...] = ()
    # a statistical check's bounds and sample sizes, per configuration (``engine.sampled-distribution``)
    statistics: dict[str, Any] | None = None

    def fail(self, violations: list[Violation]) -> None:
        self.status = "fail"
        self.violations = list(violations)
        self.detail = str(self.violations[0]).splitlines()[0] if self.violations else "failed"

    def skip(self, reason: str) -> None:
        self.status = "skip"
        self.detail = reason

    def settle(self) -> None:
        """A check that found nothing wrong: pass (or excused) if it exercised something, else skip; a check
        that tracks request relations and never reached one of them is a skip too (inconclusive, never a pass)."""
        never = [tag for tag, n in self.relations.items() if not n]
        if not self.exercised:
            self.skip(self.detail or "no example reached this check")
        elif never:
            self.skip(f"inconclusive: request relations never reached: {', '.join(never)}")
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
        if self.statistics is not None:
            extra["statistics"] = self.statistics
        if self.relations:
            extra["request_coverage"] = dict(self.relations)
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


@attrs.frozen(kw_only=True)
class Report:
    """The report of one certification: its verdict, the results and the path coverage.

    ``to_json()`` (or ``as_dict()``) is the report (``specproof.formats.report``) document, as written by
    ``--report`` (docs/contract.md, "the report"). Reading it like a dict (``report["verdict"]``)
    still works, with a ``DeprecationWarning``: use the fields or ``to_json()``.
    """

    verdict: str  # pass | fail | inconclusive (``EXIT_CODES`` of ``reports``)
    verdict_reason: str
    results: tuple[dict[str, Any], ...]  # one ``CheckResult.to_json()`` per check, in the order run
    path_coverage: dict[str, dict[str, int]]  # rounds by rollback path per engine case
    unreached_paths: dict[str, list[str]]
    seconds: float
    document: Mapping[str, Any] = attrs.field(repr=False, eq=False)

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Report:
        """The record of a report (``specproof.formats.report``) document (as ``build_report`` made it)."""
        return cls(
            verdict=str(document["verdict"]),
            verdict_reason=str(document.get("verdict_reason") or ""),
            results=tuple(document.get("results") or ()),
            path_coverage=dict(document.get("path_coverage") or {}),
            unreached_paths=dict(document.get("unreached_paths") or {}),
            seconds=float(document.get("seconds") or 0.0),
            document=dict(document),
        )

    def to_json(self) -> dict[str, Any]:
        """The report (``specproof.formats.report``) document (a copy: the record stays as it was)."""
        return dict(self.document)

    as_dict = to_json

    @property
    def interrupted(self) -> bool:
        return self.verdict == "interrupted"

    def result(self, check_id: str) -> dict[str, Any]:
        """One check's result by its id (``case-invariant`` for an engine check)."""
        for r in self.results:
            if r["id"] == check_id:
                return r
        raise KeyError(f"no check {check_id!r} in this report")

    # ---- the dict access of older versions (deprecated) -----------------------------------

    def _deprecated(self) -> None:
        warnings.warn(
            "certify() returns a Report: read its fields, or report.to_json() for the dict",
            DeprecationWarning,
            stacklevel=3,
        )

    def __getitem__(self, key: str) -> Any:
        self._deprecated()
        return self.document[key]

    def get(self, key: str, default: Any = None) -> Any:
        self._deprecated()
        return self.document.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.document

    def __iter__(self) -> Iterator[str]:
        self._deprecated()
        return iter(self.document)

    def keys(self) -> Any:
        self._deprecated()
        return self.document.keys()
