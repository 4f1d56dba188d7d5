"""Drafter invariants: ``drafter.max-length``, ``drafter.token-range``, ``drafter.deterministic``,
``drafter.no-mutation``.

Each check drives the drafter the way the decoder does (growing prefixes of one
context, the same list extended in place) and returns structured violations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Integral
from typing import TYPE_CHECKING

import attrs
import numpy as np

from specproof.contract import Violation
from specproof.engine import Drafter
from specproof.engine.conventions import draft_sequence_problem

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = [
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


def check_max_length(inv: Invariant, drafter: Drafter, context: Sequence[int], ks: Sequence[int]) -> list[Violation]:
    out: list[Violation] = []
    for length, k in drafter_history(context, [*ks, 0]):
        prefix = list(context[:length])
        draft, exc = _propose(drafter, prefix, k)
        if exc is not None:
            out.append(inv.violation(explanation=f"propose raised {exc!r}", example=_example(prefix, k)))
            break
        tokens = _as_list(draft)
        if tokens is None:
            out.append(
                inv.violation(
                    explanation=f"propose returned {type(draft).__name__}, not a sequence of ids",
                    actual=repr(draft)[:80],
                    example=_example(prefix, k),
                )
            )
        elif len(tokens) > k:
            out.append(
                inv.violation(
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
    inv: Invariant, drafter: Drafter, context: Sequence[int], ks: Sequence[int], *, vocab_size: int
) -> list[Violation]:
    out: list[Violation] = []
    for length, k in drafter_history(context, ks):
        prefix = list(context[:length])
        draft, exc = _propose(drafter, prefix, k)
        if exc is not None:
            out.append(inv.violation(explanation=f"propose raised {exc!r}", example=_example(prefix, k)))
            break
        tokens = _as_list(draft)
        if tokens is None:
            out.append(
                inv.violation(
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
                    inv.violation(
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
    inv: Invariant,
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

    if getattr(make(), "history_dependent", False) is True:
        return _check_history_dependent(inv, make, context, other, k_at)

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
                    inv.violation(
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
    if out:
        out = [attrs.evolve(v, explanation=v.explanation + HOW_TO_DECLARE) for v in out]
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


HOW_TO_DECLARE = (
    "; a drafter whose drafts depend on earlier calls by design (one that learns across calls or requests) "
    "declares it with the class attribute history_dependent = True (docs/contract.md, 'Drafters that learn "
    "across calls'), and is then held to the same call sequence giving the same drafts"
)


def _check_history_dependent(
    inv: Invariant,
    make: Callable[[], Drafter],
    context: Sequence[int],
    other: Sequence[int],
    k_at: Callable[[int], int],
) -> tuple[list[Violation], int]:
    """``drafter.deterministic`` for a declared ``history_dependent`` drafter.

    Its drafts may depend on every earlier call, so the answer is no longer a fresh drafter's;
    instead (1) replaying the recorded call sequence (an unrelated context walked, then the
    context) on a fresh drafter gives the same drafts, call for call, and (2) after ``reset()``
    it proposes exactly what a fresh drafter does along the same calls.
    """
    every = list(range(1, len(context) + 1))
    first = make()
    recorded = [("other", d) for d in _walk(first, other, list(range(1, len(other) + 1)), k_at).items()]
    recorded += [("context", d) for d in _walk(first, context, every, k_at).items()]
    replay = make()
    replayed = [("other", d) for d in _walk(replay, other, list(range(1, len(other) + 1)), k_at).items()]
    replayed += [("context", d) for d in _walk(replay, context, every, k_at).items()]
    for (which, (length, got)), (_, (_, want)) in zip(replayed, recorded, strict=True):
        if got != want:
            source = other if which == "other" else context
            return [
                inv.violation(
                    explanation="a history-dependent drafter replayed the same call sequence on a fresh instance and "
                    f"proposed differently at call on the {which} prefix of length {length} (not replayable)",
                    expected=want,
                    actual=got,
                    example=_example(source[:length], k_at(length)),
                )
            ], len(recorded)
    reset = getattr(first, "reset", None)
    if callable(reset):
        reset()
        after = _walk(first, context, every, k_at)
        fresh = _walk(make(), context, every, k_at)
        for length in every:
            if after[length] != fresh[length]:
                return [
                    inv.violation(
                        explanation="after reset() a history-dependent drafter proposed differently than a fresh one "
                        f"along the same calls, at context length {length} (reset() must start a new session)",
                        expected=fresh[length],
                        actual=after[length],
                        example=_example(context[:length], k_at(length)),
                    )
                ], len(recorded) + length
    return [], len(recorded) + (len(every) if callable(reset) else 0)


def check_no_mutation(inv: Invariant, drafter: Drafter, context: Sequence[int], ks: Sequence[int]) -> list[Violation]:
    out: list[Violation] = []
    for length, k in drafter_history(context, ks):
        prefix = list(context[:length])
        before = list(prefix)
        _, exc = _propose(drafter, prefix, k)
        if exc is None and prefix != before:
            first = next((i for i, (x, y) in enumerate(zip(before, prefix)) if x != y), min(len(before), len(prefix)))
            out.append(
                inv.violation(
                    explanation=f"propose changed the context it was given (first change at index {first}, "
                    f"length {len(before)} -> {len(prefix)})",
                    expected=before[-16:],
                    actual=prefix[-16:],
                    example=_example(before, k),
                )
            )
            break
    return out
