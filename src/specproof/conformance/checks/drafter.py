"""Drafter invariants: ``drafter.max-length``, ``drafter.token-range``, ``drafter.deterministic``,
``drafter.no-mutation``.

Each check drives the drafter the way the decoder does (growing prefixes of one
context, the same list extended in place) and returns structured violations.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from numbers import Integral

import numpy as np

from specproof.conformance._invariants import Violation
from specproof.engine import Drafter

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
    if isinstance(draft, (str, bytes)) or draft is None:
        return None
    if isinstance(draft, np.ndarray):
        return list(draft) if draft.ndim == 1 else None
    try:
        return list(draft)  # type: ignore[call-overload]
    except TypeError:
        return None


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
        for i, tok in enumerate(_as_list(draft) or []):
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


def _run_history(drafter: Drafter, context: Sequence[int], history: list[tuple[int, int]]) -> list[object]:
    """Drive the drafter as the decoder does: one list, extended in place, proposals at each length."""
    live: list[int] = []
    drafts: list[object] = []
    for length, k in history:
        live.extend(context[len(live) : length])
        draft, exc = _propose(drafter, live, k)
        tokens = _as_list(draft) or []
        drafts.append(("raised", repr(exc)) if exc is not None else [_canonical(t) for t in tokens])
    return drafts


def check_deterministic(
    make: Callable[[], Drafter], context: Sequence[int], ks: Sequence[int], *, other: Sequence[int] = ()
) -> list[Violation]:
    """Same history → same drafts: two fresh drafters, and one reused after ``reset()``.

    ``other`` is an unrelated context the reused drafter sees first, so a drafter
    whose ``reset()`` forgets nothing (or that keys on stale state) is caught.
    """
    history = drafter_history(context, ks)
    first = make()
    second = make()
    if second is first:  # an instance plug-in: a copy stands in for a second fresh one
        second = copy.deepcopy(first)
    a = _run_history(first, context, history)
    b = _run_history(second, context, history)

    def first_difference(got: list[object], explanation: str) -> list[Violation]:
        for i, (x, y) in enumerate(zip(a, got)):
            if x != y:
                length, k = history[i]
                return [
                    Violation(
                        invariant="drafter.deterministic",
                        round=i,
                        explanation=explanation,
                        expected=x,
                        actual=y,
                        example=_example(context[:length], k),
                    )
                ]
        return []

    out = first_difference(b, "two fresh drafters given the same history proposed different drafts")
    if out:
        return out
    reset = getattr(first, "reset", None)
    if callable(reset):
        if other:
            _run_history(first, other, drafter_history(other, ks))
        reset()
        return first_difference(
            _run_history(first, context, history), "after reset() the drafter did not behave like a fresh one"
        )
    return []


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


DRAFTER_CHECKS: dict[str, Callable[..., list[Violation]]] = {
    "drafter.max-length": check_max_length,
    "drafter.token-range": check_token_range,
    "drafter.deterministic": check_deterministic,
    "drafter.no-mutation": check_no_mutation,
}
