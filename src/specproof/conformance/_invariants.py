"""The invariant catalogue of DESIGN.md and the ``Violation`` record every check returns.

The ids are stable: reports, tests, ``-k`` selection and users refer to them.
"""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = ["CATALOGUE", "INVARIANT_IDS", "Invariant", "Subject", "Violation", "ViolationError", "invariant"]

Subject = Literal["drafter", "target", "engine", "trace"]


@attrs.frozen
class Invariant:
    id: str
    subject: Subject
    summary: str


CATALOGUE: dict[str, Invariant] = {
    inv.id: inv
    for inv in [
        Invariant("drafter.max-length", "drafter", "len(draft) <= k; k == 0 gives []"),
        Invariant("drafter.token-range", "drafter", "every id is an int in [0, vocab_size)"),
        Invariant(
            "drafter.deterministic", "drafter", "same history gives the same draft; reset() gives fresh behaviour"
        ),
        Invariant("drafter.no-mutation", "drafter", "the context passed in is unchanged"),
        Invariant("target.shape", "target", "logits [q, vocab_size], finite"),
        Invariant("target.processed", "target", "forward advances processed by q; restore sets it back"),
        Invariant(
            "target.chunk-invariance",
            "target",
            "one forward of q tokens == q one-token forwards (exact, or within tolerance)",
        ),
        Invariant("target.causality", "target", "row i does not depend on tokens after i"),
        Invariant(
            "target.restore", "target", "after restore, the next forward equals a fresh target fed the same prefix"
        ),
        Invariant("target.checkpoints", "target", "checkpoint i == the snapshot after i+1 tokens"),
        Invariant("target.capacity", "target", "a forward past max_context raises a clear error and changes nothing"),
        Invariant("engine.lossless", "engine", "emitted tokens == plain greedy (tie-aware)"),
        Invariant("engine.accept-bounds", "engine", "1 <= len(accepted) <= len(draft) + 1 <= k + 1"),
        Invariant("engine.accept-rule", "engine", "accepted == draft[:j] + [argmax[j]], j the longest matching prefix"),
        Invariant(
            "engine.kv-length", "engine", "processed == base + len(accepted) each round, == len(ctx) - 1 at the end"
        ),
        Invariant(
            "engine.state-restored",
            "engine",
            "after each round the target is the target that plain decoding of ctx[:-1] gives",
        ),
        Invariant(
            "engine.stop", "engine", "exactly max_new_tokens; nothing after the first EOS; never past max_context"
        ),
        Invariant(
            "engine.cost",
            "engine",
            "checkpoint: forwards == rounds (+ prefill); replay: <= one replay per rejected round; "
            ">= 1 token per round",
        ),
        Invariant(
            "trace.consistency", "trace", "tokens == the concatenated accepted, truncated as the stop reason says"
        ),
    ]
}
INVARIANT_IDS: tuple[str, ...] = tuple(CATALOGUE)


def invariant(invariant_id: str) -> Invariant:
    try:
        return CATALOGUE[invariant_id]
    except KeyError:
        raise KeyError(f"unknown invariant id {invariant_id!r}; known: {', '.join(INVARIANT_IDS)}") from None


def _jsonable(value: object) -> object:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    return value


@attrs.frozen(kw_only=True)
class Violation:
    """One breach of one invariant.

    ``round`` is the round index (None where the invariant is not per round);
    ``expected``/``actual`` are small JSON-able values; ``explanation`` is one line;
    ``example`` holds what reproduces it (prompt, k, drafts, ...).
    """

    invariant: str = attrs.field(validator=attrs.validators.in_(CATALOGUE))
    explanation: str
    round: int | None = None
    expected: object = None
    actual: object = None
    example: dict[str, object] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "invariant": self.invariant,
            "round": self.round,
            "expected": _jsonable(self.expected),
            "actual": _jsonable(self.actual),
            "explanation": self.explanation,
            "example": _jsonable(self.example),
        }

    def __str__(self) -> str:
        where = f" in round {self.round}" if self.round is not None else ""
        text = f"[{self.invariant}]{where}: {self.explanation}"
        if self.expected is not None or self.actual is not None:
            text += f"\n    expected: {_short(self.expected)}\n    actual:   {_short(self.actual)}"
        return text


def _short(value: object, limit: int = 300) -> str:
    text = repr(_jsonable(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ViolationError(AssertionError):
    """Raised by certifying tests: carries the violations so reports can show them structured."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = list(violations)
        super().__init__("\n".join(str(v) for v in self.violations))
