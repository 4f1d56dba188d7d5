"""The ``Violation`` record every check returns, and the exception that carries violations.

Invariant ids (``subject.name``) are defined once, in the registry of
``specproof.conformance`` (``specproof invariants`` prints it); this bottom layer only
checks their shape so that it imports nothing above it.
"""

from __future__ import annotations

import re

import attrs

__all__ = ["INVARIANT_ID", "Violation", "ViolationError"]

INVARIANT_ID = re.compile(r"^[a-z]+\.[a-z0-9-]+$")


def _id_shaped(_: object, attribute: attrs.Attribute, value: str) -> None:  # type: ignore[type-arg]
    if not isinstance(value, str) or not INVARIANT_ID.match(value):
        raise ValueError(f"Violation.invariant must be an invariant id like 'subject.name', got {value!r}")


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

    invariant: str = attrs.field(validator=_id_shaped)
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
