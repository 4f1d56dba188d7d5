"""Drafter invariants: ``drafter.max-length``, ``drafter.token-range``, ``drafter.deterministic``,
``drafter.no-mutation``.

Each check drives the drafter the way the decoder does (growing prefixes of one
context, the same list extended in place) and returns structured violations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Integral

import numpy as np

from specproof.contract import Violation
from specproof.engine import Drafter
from specproof.engine._validate import draft_sequence_problem

__all__ = [
    "DRAFTER_CHECKS",
    "check_deterministic",
    "check_max_length",
    "check_no_mutation",
    "check_token_range",
    "drafter_history",
]


def drafter_history(context: Sequence[int], ks: Sequence[int]) -> list[tuple[int, int]]:
    """A decoder-like history: ``(prefix_length, k)`` calls over growing prefixes of ``context``."""
    n = len(context)
    if n == 0:
        return []
    calls = len(ks)
    # spread the calls over the context so the drafter sees it grow
    lengths = sorted({max(1, n - (calls - 1 - i) * max(1, n // (calls + 1))) for i in range(calls)})
    return [(length, ks[i % len(ks)]) for i, length in enumerate(lengths)]


def _propose(drafter: Drafter, context: list[int], k: int) -> tuple[object, Exception | None]:
    try:
        return drafter.propose(context, k), None
    except Exception as exc:  # a drafter that raises breaks every invariant it is asked about
        return None, exc


def _as_list(draft: object) -> list[object] | None:
    """The draft as a list, or None where the decoder would reject its shape (generator, None, str)."""
    return None if draft_sequence_problem(draft) is not None else list(draft)  # type: ignore[call-overload]


def _example(context: Sequence[int], k: int) -> dict[str, object]:
    return {"context": list(context), "k": k}


def check_max_length(drafter: Drafter, context: Sequence[int], ks: Sequence[int]) -> list[Violation]:
    out: list[Violation] = []
    for length, k in drafter_history(context, [*ks, 0]):
        prefix = list(context[:length])
        draft, exc = _propose(drafter, prefix, k)
        if exc is not None:
            out.append(
                Violation(
                    invariant="drafter.max-length", explanation=f"propose raised {exc!r}", example=_example(prefix, k)
                )
            )
            break
        tokens = _as_list(draft)
        if tokens is None:
            out.append(
                Violation(
                    invariant="drafter.max-length",
                    explanation=f"propose returned {type(draft).__name__}, not a sequence of ids",
                    actual=repr(draft)[:80],
                    example=_example(prefix, k),
                )
            )
        elif len(tokens) > k:
            out.append(
                Violation(
                    invariant="drafter.max-length",
                    explanation=f"asked for at most k={k} tokens, proposed {len(tokens)}",
                    expected=f"<= {k} tokens",
                    actual=tokens,
                    example=_example(prefix, k),
                )
            )
        if out:
            break
    return out


def check_token_range(
    drafter: Drafter, context: Sequence[int], ks: Sequence[int], *, vocab_size: int
) -> list[Violation]:
    out: list[Violation] = []
    for length, k in drafter_history(context, ks):
        prefix = list(context[:length])
        draft, exc = _propose(drafter, prefix, k)
        if exc is not None:
            out.append(
                Violation(
                    invariant="drafter.token-range", explanation=f"propose raised {exc!r}", example=_example(prefix, k)
                )
            )
            break
        tokens = _as_list(draft)
        if tokens is None:
            out.append(
                Violation(
                    invariant="drafter.token-range",
                    explanation=f"propose {draft_sequence_problem(draft)} (the decoder rejects it)",
                    expected="a list, tuple or 1-D array of int ids",
                    actual=repr(draft)[:80],
                    example=_example(prefix, k),
                )
            )
            return out
        for i, tok in enumerate(tokens):
            if not isinstance(tok, Integral) or isinstance(tok, (bool, np.bool_)) or not 0 <= int(tok) < vocab_size:
                out.append(
                    Violation(
                        invariant="drafter.token-range",
                        explanation=f"draft[{i}]={tok!r} is not an int id in [0, {vocab_size})",
                        expected=f"int in [0, {vocab_size})",
                        actual=repr(tok),
                        example=_example(prefix, k),
                    )
                )
                return out
    return out


def _canonical(tok: object) -> object:
    """Ints compare as ints (numpy ints included); anything else by its repr."""
    return int(tok) if isinstance(tok, Integral) else repr(tok)


def _walk(
    drafter: Drafter, context: Sequence[int], positions: Sequence[int], k_at: Callable[[int], int]
) -> dict[int, object]:
    """Drive the drafter as a decoder does: one list extended in place, a proposal at each position."""
    live: list[int] = []
    drafts: dict[int, object] = {}
    for length in positions:
        live.extend(context[len(live) : length])
        draft, exc = _propose(drafter, live, k_at(length))
        tokens = _as_list(draft)
        drafts[length] = (
            ("raised", repr(exc))
            if exc is not None
            else ("not a sequence", type(draft).__name__)
            if tokens is None
            else [_canonical(t) for t in tokens]
        )
    return drafts


def check_deterministic(
    make: Callable[[], Drafter],
    context: Sequence[int],
    ks: Sequence[int],
    *,
    other: Sequence[int] = (),
    called: Sequence[bool] = (),
    max_compared: int = 12,
) -> tuple[list[Violation], int]:
    """The draft depends only on the context passed in and k (docs/contract.md, "drafters").

    The answer for ``(context[:L], k)`` is, by definition, what a fresh drafter proposes when
    asked once. Three drafters must give it at every compared position ``L``:

    - one called at every position (as an engine that drafts every round);
    - one called only where ``called`` says (an engine skips calls: ``k_eff = 0``, varying k),
      so a drafter whose draft depends on which earlier calls it saw is caught;
    - one that first walks the unrelated context ``other``, then ``reset()`` (when it has one:
      engines call it at the start of every generation), then walks ``context``, so state kept
      across generations or a cache keyed on less than the whole history is caught.

    The k of a call is a function of the position (``ks[L % len(ks)]``), so a cache keyed on
    ``(len(context), k)`` meets the same key in ``other`` and in ``context``. Returns the
    violations (the first difference) and how many proposals were compared.
    """
    n = len(context)
    if n == 0 or not ks:
        return [], 0

    def k_at(length: int) -> int:
        return int(ks[length % len(ks)])

    every = list(range(1, n + 1))
    sparse = [p for p in every if p == n or (p - 1 < len(called) and called[p - 1])]
    step = max(1, len(sparse) // max_compared)
    compared = sorted({*sparse[::step][:max_compared], n})
    fresh: dict[int, object] = {}
    for length in compared:
        fresh.update(_walk(make(), context, [length], k_at))

    def first_difference(got: dict[int, object], explanation: str) -> list[Violation]:
        for length in compared:
            if got[length] != fresh[length]:
                return [
                    Violation(
                        invariant="drafter.deterministic",
                        explanation=f"{explanation} than a fresh drafter asked once, at context length {length}",
                        expected=fresh[length],
                        actual=got[length],
                        example={**_example(context[:length], k_at(length)), "called_at": list(sparse)[:64]},
                    )
                ]
        return []

    out = first_difference(_walk(make(), context, every, k_at), "called at every position, it proposed differently")
    if not out:
        out = first_difference(
            _walk(make(), context, sparse, k_at), "called at only some positions, it proposed differently"
        )
    if not out and other:
        reused = make()
        _walk(reused, other, list(range(1, len(other) + 1)), k_at)
        reset = getattr(reused, "reset", None)
        if callable(reset):
            reset()
            why = "after an unrelated generation and reset(), it proposed differently"
        else:
            why = "after an unrelated generation (it has no reset()), it proposed differently"
        out = first_difference(_walk(reused, context, every, k_at), why)
    return out, len(compared) * (4 if other else 3)


def check_no_mutation(drafter: Drafter, context: Sequence[int], ks: Sequence[int]) -> list[Violation]:
    out: list[Violation] = []
    for length, k in drafter_history(context, ks):
        prefix = list(context[:length])
        before = list(prefix)
        _, exc = _propose(drafter, prefix, k)
        if exc is None and prefix != before:
            first = next((i for i, (x, y) in enumerate(zip(before, prefix)) if x != y), min(len(before), len(prefix)))
            out.append(
                Violation(
                    invariant="drafter.no-mutation",
                    explanation=f"propose changed the context it was given (first change at index {first}, "
                    f"length {len(before)} -> {len(prefix)})",
                    expected=before[-16:],
                    actual=prefix[-16:],
                    example=_example(before, k),
                )
            )
            break
    return out


DRAFTER_CHECKS: dict[str, Callable[..., object]] = {
    "drafter.max-length": check_max_length,
    "drafter.token-range": check_token_range,
    "drafter.deterministic": check_deterministic,
    "drafter.no-mutation": check_no_mutation,
}
