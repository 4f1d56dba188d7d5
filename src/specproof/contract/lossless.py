"""Tie-aware losslessness (docs/contract.md, "lossless"): compare an engine's tokens with plain greedy's.

Identical tokens pass. At the first divergence the verdict is ``excused`` only if
the top-2 logit margin there (the smaller of the margins given, i.e. in the run
being compared) is below ``tie_tolerance``: the two runs then disagree on a
near-tie, which a target that is not batch-invariant (fp16 on a Neural Engine,
BLAS kernels that differ between q=1 and q=k+1) may legitimately break either way.
Past an excused divergence the contexts differ, so nothing more can be compared.
With ``tie_tolerance=0`` nothing is ever excused: the gate is exact, as it must be
on the reference target.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

import attrs

from specproof.contract._records import STOP_REASONS
from specproof.contract.errors import InvalidSettingError

__all__ = ["LosslessStatus", "LosslessVerdict", "VerdictSummary", "compare_lossless", "summarise_verdicts"]

LosslessStatus = Literal["pass", "excused", "fail"]


@attrs.frozen(kw_only=True)
class LosslessVerdict:
    """The outcome of one comparison.

    ``index`` is the first token index where the runs differ (None when they agree,
    or when one is a prefix of the other and the stop reason explains it);
    ``margin`` the top-2 margin used at that index (None when no margin was known);
    ``compared`` how many leading tokens were found equal; ``expected`` / ``actual``
    the tokens at ``index`` in each run (None where a run has none there).
    A judge turns a ``fail`` into a violation of its own invariant with ``breach()``:
    this bottom layer names no invariant (docs/contract.md, "the registry").
    """

    status: LosslessStatus
    explanation: str
    index: int | None = None
    margin: float | None = None
    compared: int = 0
    expected: int | None = None
    actual: int | None = None

    def breach(self) -> dict[str, object] | None:
        """The fields of the violation a ``fail`` is (``Invariant.violation(**breach)``); None otherwise."""
        if self.status != "fail":
            return None
        margin: object = self.margin
        if isinstance(margin, float) and not math.isfinite(margin):
            margin = str(margin)
        return {
            "expected": self.expected,
            "actual": self.actual,
            "explanation": self.explanation,
            "example": {"index": self.index, "margin": margin},
        }

    @property
    def ok(self) -> bool:
        """True for ``pass`` and ``excused`` (an excused near-tie is not a failure)."""
        return self.status != "fail"

    def to_json(self) -> dict[str, object]:
        margin: object = self.margin
        if isinstance(margin, float) and not math.isfinite(margin):
            margin = str(margin)  # JSON has no inf
        return {
            "status": self.status,
            "index": self.index,
            "margin": margin,
            "compared": self.compared,
            "explanation": self.explanation,
            "expected": self.expected,
            "actual": self.actual,
        }


def _tokens(values: Sequence[int], name: str) -> list[int]:
    if isinstance(values, (str, bytes)):
        raise InvalidSettingError(f"{name} must be a sequence of token ids, got {type(values).__name__}")
    out: list[int] = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise InvalidSettingError(f"{name}[{i}]={v!r} is not a token id")
        out.append(int(v.__index__()))
    return out


def _margins(values: Sequence[float] | None, name: str) -> list[float] | None:
    if values is None:
        return None
    out: list[float] = []
    for i, v in enumerate(values):
        try:
            m = float(v)
        except (TypeError, ValueError):
            raise InvalidSettingError(f"{name}[{i}]={v!r} is not a number") from None
        if math.isnan(m) or m < 0:
            raise InvalidSettingError(f"{name}[{i}]={v!r}: a top-2 margin is a number >= 0")
        out.append(m)
    return out


def _margin_at(index: int, *margins: list[float] | None) -> float | None:
    known = [m[index] for m in margins if m is not None and index < len(m)]
    return min(known) if known else None


def _check_stop(value: str | None, name: str) -> str | None:
    if value is not None and value not in STOP_REASONS:
        raise InvalidSettingError(f"{name}={value!r} is not one of {STOP_REASONS}")
    return value


def compare_lossless(
    actual_tokens: Sequence[int],
    expected_tokens: Sequence[int],
    *,
    expected_margins: Sequence[float] | None = None,
    actual_margins: Sequence[float] | None = None,
    tie_tolerance: float = 0.0,
    actual_stop_reason: str | None = None,
    expected_stop_reason: str | None = None,
) -> LosslessVerdict:
    """The tie-aware ``engine.lossless`` verdict for ``actual_tokens`` against greedy's ``expected_tokens``.

    ``expected_margins[i]`` / ``actual_margins[i]`` are the top-2 logit margins of
    the row that chose token ``i`` in each run (either may be None or short); a
    divergence is excused only if the smaller known margin there is
    ``< tie_tolerance``. When one run is a prefix of the other, the actual run may
    stop short only if its stop reason is ``eos`` (ending in the EOS it was told to
    stop at) or ``context_full`` (its target was full, and greedy's reference ran in
    a larger one: ``expected_stop_reason`` is not ``context_full``); emitting more than greedy —
    past greedy's EOS, context or budget — always fails.
    """
    actual = _tokens(actual_tokens, "actual_tokens")
    expected = _tokens(expected_tokens, "expected_tokens")
    exp_m = _margins(expected_margins, "expected_margins")
    act_m = _margins(actual_margins, "actual_margins")
    tol = _tie_tolerance(tie_tolerance)
    actual_stop = _check_stop(actual_stop_reason, "actual_stop_reason")
    expected_stop = _check_stop(expected_stop_reason, "expected_stop_reason")

    common = min(len(actual), len(expected))
    index = next((i for i in range(common) if actual[i] != expected[i]), None)
    if index is None:
        return _prefix_verdict(actual, expected, exp_m, act_m, actual_stop=actual_stop, expected_stop=expected_stop)
    return _divergence_verdict(index, actual, expected, _margin_at(index, exp_m, act_m), tol)


def _tie_tolerance(tie_tolerance: float) -> float:
    try:
        tol = float(tie_tolerance)
    except (TypeError, ValueError):
        raise InvalidSettingError(f"tie_tolerance={tie_tolerance!r} is not a number") from None
    if math.isnan(tol) or tol < 0:
        raise InvalidSettingError(f"tie_tolerance={tie_tolerance!r} must be a number >= 0")
    return tol


def _prefix_verdict(
    actual: list[int],
    expected: list[int],
    exp_m: list[float] | None,
    act_m: list[float] | None,
    *,
    actual_stop: str | None,
    expected_stop: str | None,
) -> LosslessVerdict:
    """The verdict when one run is a prefix of the other: equal, stopped short (excused by EOS or a full
    context only), or emitted past greedy's end."""
    common = min(len(actual), len(expected))
    if len(actual) == len(expected):
        return LosslessVerdict(status="pass", compared=common, explanation=f"all {common} tokens equal plain greedy's")
    if len(actual) < len(expected):
        # A full context explains stopping short only if greedy's own target was not
        # full at that point too (a reference from a larger context, a golden file).
        if actual_stop == "eos" or (actual_stop == "context_full" and expected_stop != "context_full"):
            why = "an EOS" if actual_stop == "eos" else "a full context"
            return LosslessVerdict(
                status="pass",
                compared=common,
                explanation=(
                    f"all {common} tokens equal plain greedy's; the run stopped at {why}, "
                    f"where the greedy reference ran on to {len(expected)} tokens"
                ),
            )
        return _fail(
            index=common,
            expected=expected[common],
            actual=None,
            margin=_margin_at(common, exp_m, act_m),
            compared=common,
            explanation=(
                f"the engine stopped after {len(actual)} tokens (stop: {actual_stop or 'not given'}) "
                f"but plain greedy emits {len(expected)}: token {common} ({expected[common]}) is missing"
            ),
        )
    where = {
        "eos": "greedy stopped at EOS",
        "context_full": "greedy's target was full",
        "max_new_tokens": "greedy reached max_new_tokens",
    }.get(expected_stop or "", "greedy stops")
    return _fail(
        index=common,
        expected=None,
        actual=actual[common],
        margin=None,
        compared=common,
        explanation=(
            f"the engine emitted {len(actual)} tokens, {len(actual) - common} more than plain greedy: "
            f"token {common} ({actual[common]}) comes after {where}"
        ),
    )


def _divergence_verdict(
    index: int, actual: list[int], expected: list[int], margin: float | None, tol: float
) -> LosslessVerdict:
    """The verdict at the first differing token: excused on a near-tie (margin < tolerance), else a failure."""
    if margin is not None and margin < tol:
        rest = max(len(actual), len(expected)) - index - 1
        return LosslessVerdict(
            status="excused",
            index=index,
            margin=margin,
            compared=index,
            explanation=(
                f"token {index} differs (greedy {expected[index]}, engine {actual[index]}) on a near-tie: "
                f"top-2 margin {margin:.3g} < tie tolerance {tol:.3g}; the {rest} token(s) after it "
                "cannot be compared (the contexts differ)"
            ),
        )
    if margin is None:
        why = "no margin was recorded there" if tol > 0 else "the gate is exact (tie tolerance 0)"
    elif tol > 0:
        why = f"top-2 margin {margin:.3g} >= tie tolerance {tol:.3g}, not a near-tie"
    else:
        why = f"top-2 margin {margin:.3g}; the gate is exact (tie tolerance 0)"
    return _fail(
        index=index,
        expected=expected[index],
        actual=actual[index],
        margin=margin,
        compared=index,
        explanation=(
            f"token {index} differs from plain greedy (greedy {expected[index]}, engine {actual[index]}); {why}"
        ),
    )


def _fail(
    *, index: int, expected: int | None, actual: int | None, margin: float | None, compared: int, explanation: str
) -> LosslessVerdict:
    return LosslessVerdict(
        status="fail",
        index=index,
        margin=margin,
        compared=compared,
        explanation=explanation,
        expected=expected,
        actual=actual,
    )


@attrs.frozen(kw_only=True)
class VerdictSummary:
    """Counts of verdicts by status and the margins of the excused ones (for reports)."""

    passed: int
    excused: int
    failed: int
    excused_margins: tuple[float, ...]

    @property
    def total(self) -> int:
        return self.passed + self.excused + self.failed

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def describe_excused(self) -> str:
        """``excused (3, margins 1e-06..4e-06)``; ``excused (0)`` when none."""
        if not self.excused:
            return "excused (0)"
        known = sorted(self.excused_margins)
        if not known:
            return f"excused ({self.excused})"
        span = f"{known[0]:.3g}" if known[0] == known[-1] else f"{known[0]:.3g}..{known[-1]:.3g}"
        return f"excused ({self.excused}, margin{'s' if len(known) > 1 else ''} {span})"

    def __str__(self) -> str:
        return f"pass {self.passed}, {self.describe_excused()}, fail {self.failed}"

    def to_json(self) -> dict[str, object]:
        return {
            "pass": self.passed,
            "excused": self.excused,
            "fail": self.failed,
            "excused_margins": list(self.excused_margins),
        }


def summarise_verdicts(verdicts: Iterable[LosslessVerdict]) -> VerdictSummary:
    """Fold verdicts into counts by status and the excused margins."""
    counts = {"pass": 0, "excused": 0, "fail": 0}
    margins: list[float] = []
    for verdict in verdicts:
        if not isinstance(verdict, LosslessVerdict):
            raise InvalidSettingError(f"summarise_verdicts expects LosslessVerdict records, got {verdict!r}")
        counts[verdict.status] += 1
        if verdict.status == "excused" and verdict.margin is not None:
            margins.append(verdict.margin)
    return VerdictSummary(
        passed=counts["pass"], excused=counts["excused"], failed=counts["fail"], excused_margins=tuple(margins)
    )
