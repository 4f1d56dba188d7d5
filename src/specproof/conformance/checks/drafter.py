"""Drafter invariants: ``drafter.max-length``, ``drafter.token-range``, ``drafter.deterministic``,
``drafter.no-mutation``.

Each check drives the drafter the way the decoder does (growing prefixes of one
context, the same list extended in place) and returns structured violations.
``drafter.deterministic`` and ``drafter.no-mutation`` drive it through the walks and
sessions of requests of ``_drafter_walks`` and judge every call they make.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from numbers import Integral
from typing import TYPE_CHECKING

import numpy as np

from specproof.conformance.checks._drafter_walks import (
    Call,
    FreshDrafts,
    Request,
    decoder_walk,
    propose_once,
    request_lengths,
    session_requests,
    walk_positions,
    walk_session,
)
from specproof.conformance.checks._relation_walk import WalkCall, relation_walk
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


def _as_list(draft: object) -> list[object] | None:
    """The draft as a list, or None where the decoder would reject its shape (generator, None, str)."""
    return None if draft_sequence_problem(draft) is not None else list(draft)  # type: ignore[call-overload]


def _example(context: Sequence[int], k: int) -> dict[str, object]:
    return {"context": list(context), "k": k}


def _walk_example(walk: Sequence[WalkCall], i: int) -> dict[str, object]:
    """A call's example: its context and k, what the walk did there, and the calls before it (what led there)."""
    at = walk[i]
    return {
        **_example(at.context, at.call.k),
        "call": at.call.number,
        "step": at.call.request,
        "relation": list(at.tags),
        "walk": [
            {
                "call": c.call.number,
                "step": c.call.request,
                "length": c.call.length,
                "k": c.call.k,
                "relation": list(c.tags),
            }
            for c in walk[max(0, i - _SHOWN_STEPS + 1) : i + 1]
        ],
    }


def _where(at: WalkCall) -> str:
    return (
        f"at call {at.call.number} of a walk of requests ({at.call.request}; context length {at.call.length}, "
        f"k={at.call.k}; {', '.join(at.tags)})"
    )


def _walk(
    drafter: Drafter,
    context: Sequence[int],
    ks: Sequence[int],
    *,
    other: Sequence[int],
    prompt: int | None,
    accepts: Sequence[int],
    vocab_size: int | None,
    coverage: Counter[str] | None,
) -> list[WalkCall]:
    n = len(context)
    calls, counts = relation_walk(
        drafter,
        context,
        other,
        prompt=prompt if prompt is not None else (n + 1) // 2,
        ks=ks,
        accepts=accepts,
        vocab_size=vocab_size,
    )
    if coverage is not None:
        coverage.update(counts)
    return calls


def check_max_length(
    inv: Invariant,
    drafter: Drafter,
    context: Sequence[int],
    ks: Sequence[int],
    *,
    other: Sequence[int] = (),
    prompt: int | None = None,
    accepts: Sequence[int] = (),
    vocab_size: int | None = None,
    coverage: Counter[str] | None = None,
) -> list[Violation]:
    """``len(draft) <= k`` (``[]`` for ``k == 0``) at every call of a relation walk (``_relation_walk``): a
    drafter whose depth grows over requests, or whose cache is not cut to a smaller ``k``, is caught where
    it happens. ``coverage`` (optional) is updated with the relation tags the walk reached."""
    if not context or not ks:
        return []
    walk = _walk(
        drafter, context, ks, other=other, prompt=prompt, accepts=accepts, vocab_size=vocab_size, coverage=coverage
    )
    for i, at in enumerate(walk):
        call = at.call
        if call.error is not None:
            return [
                inv.violation(explanation=f"propose raised {call.error} {_where(at)}", example=_walk_example(walk, i))
            ]
        tokens = _as_list(at.raw)
        if tokens is None:
            return [
                inv.violation(
                    explanation=f"propose returned {type(at.raw).__name__}, not a sequence of ids, {_where(at)}",
                    actual=repr(at.raw)[:80],
                    example=_walk_example(walk, i),
                )
            ]
        if len(tokens) > call.k:
            return [
                inv.violation(
                    explanation=f"asked for at most k={call.k} tokens, proposed {len(tokens)}, {_where(at)}",
                    expected=f"<= {call.k} tokens",
                    actual=call.draft,
                    example=_walk_example(walk, i),
                )
            ]
    return []


def check_token_range(
    inv: Invariant,
    drafter: Drafter,
    context: Sequence[int],
    ks: Sequence[int],
    *,
    vocab_size: int,
    other: Sequence[int] = (),
    prompt: int | None = None,
    accepts: Sequence[int] = (),
    coverage: Counter[str] | None = None,
) -> list[Violation]:
    """Every draft of every call of a relation walk is a sequence of int ids in ``[0, vocab_size)``."""
    if not context or not ks:
        return []
    walk = _walk(
        drafter, context, ks, other=other, prompt=prompt, accepts=accepts, vocab_size=vocab_size, coverage=coverage
    )
    for i, at in enumerate(walk):
        if at.call.error is not None:
            return [
                inv.violation(
                    explanation=f"propose raised {at.call.error} {_where(at)}", example=_walk_example(walk, i)
                )
            ]
        tokens = _as_list(at.raw)
        if tokens is None:
            return [
                inv.violation(
                    explanation=f"propose {draft_sequence_problem(at.raw)} (the decoder rejects it), {_where(at)}",
                    expected="a list, tuple or 1-D array of int ids",
                    actual=repr(at.raw)[:80],
                    example=_walk_example(walk, i),
                )
            ]
        for j, tok in enumerate(tokens):
            if not isinstance(tok, Integral) or isinstance(tok, (bool, np.bool_)) or not 0 <= int(tok) < vocab_size:
                return [
                    inv.violation(
                        explanation=f"draft[{j}]={tok!r} is not an int id in [0, {vocab_size}), {_where(at)}",
                        expected=f"int in [0, {vocab_size})",
                        actual=repr(tok),
                        example=_walk_example(walk, i),
                    )
                ]
    return []


HOW_TO_DECLARE = (
    "; a drafter whose drafts depend on earlier calls by design (one that learns across calls or requests) "
    "declares it with the class attribute history_dependent = True (docs/contract.md, 'Drafters that learn "
    "across calls'), and is then held to the same call sequence giving the same drafts"
)

_SHOWN_CALLS = 64  # call positions an example lists
_SHOWN_STEPS = 12  # calls of a relation walk an example lists (the last ones, up to the failing call)


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def _raised(call: Call, where: str, fresh_error: str | None = None) -> str:
    also = "; a fresh drafter asked once raised too, which is no excuse" if fresh_error is not None else ""
    return (
        f"{where}: propose raised {call.error} at call {call.number} (context length {call.length}, k={call.k}); "
        f"a drafter must draft on every context it is given{also}"
    )


def _against_fresh(
    inv: Invariant,
    calls: Sequence[Call],
    fresh: FreshDrafts,
    context: Sequence[int],
    why: str,
    extra: dict[str, object],
    hint: str = "",
) -> Violation | None:
    """The first call of a walk whose draft is not a fresh drafter's at the same context length (its explanation
    ending with ``hint``), or that raised."""
    for i, call in enumerate(calls):
        want, fresh_error = fresh(call.length)
        example = {
            **_example(context[: call.length], call.k),
            **extra,
            "called_at": [c.length for c in calls[: i + 1]][-_SHOWN_CALLS:],
        }
        if call.error is not None:
            return inv.violation(explanation=_raised(call, why, fresh_error), actual=call.draft, example=example)
        if call.draft != want:
            fresh_said = f" (which raised {fresh_error})" if fresh_error is not None else ""
            return inv.violation(
                explanation=f"{why}, it proposed differently than a fresh drafter asked once{fresh_said}, "
                f"at context length {call.length} (call {call.number} of the walk){hint}",
                expected=want,
                actual=call.draft,
                example=example,
            )
    return None


def check_deterministic(
    inv: Invariant,
    make: Callable[[], Drafter],
    context: Sequence[int],
    ks: Sequence[int],
    *,
    other: Sequence[int] = (),
    called: Sequence[bool] = (),
    accepts: Sequence[int] = (),
    prompt: int | None = None,
    vocab_size: int | None = None,
    coverage: Counter[str] | None = None,
) -> tuple[list[Violation], int]:
    """The draft depends only on the context passed in and k (docs/contract.md, "drafters").

    The answer for ``(context[:L], k)`` is, by definition, what a fresh drafter proposes when
    asked once. First a drafter is driven as a decoder does (``decoder_walk``): its first call
    the whole prompt ``context[:prompt]``, then rounds keeping ``accepts[i]`` tokens of its
    draft (all of them: a full accept) and a bonus token from ``context``; the context this
    builds is the one every walk below runs on, and every call of every walk is compared
    with a fresh drafter at the same length:

    - the decoder walk itself, so draft state kept after an accept (a head's draft chain) is caught;
    - one drafter called at every position (as an engine that drafts every round);
    - one called only where ``called`` says (an engine skips calls: ``k_eff = 0``, varying k),
      so a drafter whose draft depends on which earlier calls it saw is caught;
    - two that first walk an unrelated context (``other``), then ``reset()`` (when they have
      one: engines call it at the start of every generation), then start with a whole prompt,
      one longer and one shorter than the context they held, then grow it by one token per
      call: state kept across generations, a lazy reset, a cache keyed on less than the
      whole history (``(len(context), k)``) or a buffer read past the context are caught;
    - one driven through a relation walk (``_relation_walk``: every relation of the coverage
      model of requests, k larger, equal and smaller at one length, regenerates and user turns
      after ``reset()``), each call against a fresh drafter asked once at its context and k.

    The k of a call is a function of the position (``ks[L % len(ks)]``), so a cache keyed on
    ``(len(context), k)`` meets the same key in ``other`` and in ``context``. A call that
    raises is a failure, never agreement with a fresh drafter that raised too. Returns the
    violations (the first difference) and how many proposals were compared. A declared
    ``history_dependent`` drafter is judged on sessions of requests instead
    (``_check_history_dependent``).
    """
    n = len(context)
    if n == 0 or not ks:
        return [], 0

    def k_at(length: int) -> int:
        return int(ks[length % len(ks)])

    first_prompt = max(1, min(n, prompt if prompt is not None else (n + 1) // 2))
    walk = partial(
        relation_walk, context=context, other=other, prompt=first_prompt, ks=ks, accepts=accepts, vocab_size=vocab_size
    )
    if getattr(make(), "history_dependent", False) is True:
        found, compared = _check_history_dependent(inv, make, context, other, k_at, first_prompt)
        if not found:
            found, more = _replayed_walk(inv, make, walk, coverage)
            compared += more
        return found, compared

    return _walks_against_fresh(
        inv,
        make,
        context,
        first_prompt=first_prompt,
        accepts=accepts,
        called=called,
        other=other,
        k_at=k_at,
        vocab_size=vocab_size,
        walk=walk,
        coverage=coverage,
    )


def _walks_against_fresh(
    inv: Invariant,
    make: Callable[[], Drafter],
    context: Sequence[int],
    *,
    first_prompt: int,
    accepts: Sequence[int],
    called: Sequence[bool],
    other: Sequence[int],
    k_at: Callable[[int], int],
    vocab_size: int | None,
    walk: Callable[[Drafter], tuple[list[WalkCall], Counter[str]]],
    coverage: Counter[str] | None,
) -> tuple[list[Violation], int]:
    """``check_deterministic``'s walks of a drafter that declares no history dependence (its docstring lists
    them), each call against a fresh drafter asked once; the first difference and the proposals compared."""
    walked, decoder_calls = decoder_walk(make(), context, first_prompt, accepts, k_at, vocab_size=vocab_size)
    size = len(walked)
    every = list(range(1, size + 1))
    fresh = FreshDrafts(make, walked, k_at)
    sparse = [p for p in every if p == size or (p - 1 < len(called) and called[p - 1])]
    compared = 0

    def judge(calls: Sequence[Call], why: str, hint: str = "", **extra: object) -> list[Violation]:
        nonlocal compared
        compared += len(calls)
        found = _against_fresh(inv, calls, fresh, walked, why, extra, hint)
        return [] if found is None else [found]

    # a difference within one generation may be by design: the message says how to declare it
    out = judge(walk_positions(make(), walked, every, k_at), "called at every position", HOW_TO_DECLARE)
    if not out:
        out = judge(walk_positions(make(), walked, sparse, k_at), "called at only some positions", HOW_TO_DECLARE)
    if not out:
        out = judge(
            decoder_calls,
            f"called as a decoder does (first the whole prompt of {_tokens(first_prompt)}, then each round's accepted "
            "draft tokens, all or some, and a bonus token)",
            HOW_TO_DECLARE,
            accepts=list(accepts),
        )
    if not out and other:
        out = _after_reset(inv, make, walked, other, first_prompt, k_at, judge)
    if not out:
        calls, counts = walk(make())
        if coverage is not None:
            coverage.update(counts)
        compared += len(calls)
        out = _walk_against_fresh(inv, make, calls)
    return out, compared


def _walk_against_fresh(inv: Invariant, make: Callable[[], Drafter], walk: Sequence[WalkCall]) -> list[Violation]:
    """The first call of a relation walk whose draft is not a fresh drafter's asked once at its context and k."""
    for i, at in enumerate(walk):
        want, fresh_error, _ = propose_once(make(), list(at.context), at.call.k)
        if at.call.error is not None:
            return [
                inv.violation(
                    explanation=_raised(at.call, f"on a walk of requests ({at.call.request})", fresh_error),
                    actual=at.call.draft,
                    example=_walk_example(walk, i),
                )
            ]
        if at.call.draft != want:
            fresh_said = f" (which raised {fresh_error})" if fresh_error is not None else ""
            return [
                inv.violation(
                    explanation=f"{_where(at)}, it proposed differently than a fresh drafter asked once at the same "
                    f"context and k{fresh_said}{HOW_TO_DECLARE}",
                    expected=want,
                    actual=at.call.draft,
                    example=_walk_example(walk, i),
                )
            ]
    return []


def _replayed_walk(
    inv: Invariant,
    make: Callable[[], Drafter],
    walk: Callable[[Drafter], tuple[list[WalkCall], Counter[str]]],
    coverage: Counter[str] | None,
) -> tuple[list[Violation], int]:
    """A declared history-dependent drafter on a relation walk: no call raises, and a fresh instance driven
    through the same walk proposes the same drafts, call for call (its drafts may depend on earlier calls,
    never on anything else)."""
    recorded, counts = walk(make())
    if coverage is not None:
        coverage.update(counts)
    for i, at in enumerate(recorded):
        if at.call.error is not None:
            return [
                inv.violation(
                    explanation=_raised(
                        at.call, f"a history-dependent drafter, on a walk of requests ({at.call.request})"
                    ),
                    actual=at.call.draft,
                    example=_walk_example(recorded, i),
                )
            ], i + 1
    replayed, _ = walk(make())
    for i, (got, want) in enumerate(zip(replayed, recorded)):
        if got.call.draft != want.call.draft or got.context != want.context:
            return [
                inv.violation(
                    explanation="a history-dependent drafter replayed the same walk of requests on a fresh instance "
                    f"and proposed differently {_where(got)} (not replayable)",
                    expected=want.call.draft,
                    actual=got.call.draft,
                    example=_walk_example(recorded, i),
                )
            ], 2 * (i + 1)
    return [], 2 * len(recorded)


def _after_reset(
    inv: Invariant,
    make: Callable[[], Drafter],
    walked: Sequence[int],
    other: Sequence[int],
    first_prompt: int,
    k_at: Callable[[int], int],
    judge: Callable[..., list[Violation]],
) -> list[Violation]:
    """Two drafters that walk an unrelated context, ``reset()``, then start with a whole prompt: one longer than
    the context they held, one shorter; each call after the reset judged against a fresh drafter."""
    size = len(walked)
    start = max(2, min(first_prompt, size)) if size >= 2 else 1
    helds: list[tuple[str, list[int]]] = []
    if start >= 2:
        helds.append(("longer", [int(t) for t in other[: min(len(other), start - 1)]]))
    repeats = start // len(other) + 2
    helds.append(("shorter", [int(t) for t in (list(other) * repeats)[: max(len(other), start + 1)]]))
    for relation, held in helds:
        drafter = make()
        before = walk_positions(drafter, held, range(1, len(held) + 1), k_at)
        broke = next((c for c in before if c.error is not None), None)
        if broke is not None:
            return [
                inv.violation(
                    explanation=_raised(broke, "walking an unrelated context"),
                    example=_example(held[: broke.length], broke.k),
                )
            ]
        reset = getattr(drafter, "reset", None)
        if callable(reset):
            reset()
            how = "after an unrelated generation and reset()"
        else:
            how = "after an unrelated generation (it has no reset())"
        why = (
            f"{how}, starting with a whole prompt of {_tokens(start)} ({relation} than the "
            f"{_tokens(len(held))} it held, then one more token per call)"
        )
        found = judge(walk_positions(drafter, walked, range(start, size + 1), k_at), why, held=held)
        if found:
            return found
    return []


def _session_example(requests: Sequence[Request], call: Call) -> dict[str, object]:
    request = next(r for r in requests if r.name == call.request)
    return {
        **_example(request.tokens[: call.length], call.k),
        "request": call.request,
        "session": [
            {"request": r.name, "prompt": list(r.tokens[: r.prompt]), "length": len(r.tokens)} for r in requests
        ],
    }


def _check_history_dependent(
    inv: Invariant,
    make: Callable[[], Drafter],
    context: Sequence[int],
    other: Sequence[int],
    k_at: Callable[[int], int],
    prompt: int,
) -> tuple[list[Violation], int]:
    """``drafter.deterministic`` for a declared ``history_dependent`` drafter, over a session of requests.

    Its drafts may depend on every earlier call, so the answer is no longer a fresh drafter's.
    A session (``session_requests``: a new prompt, another, an edit, a shorter prefix of an
    earlier request, a user turn appended; each request's first call its whole prompt) is
    driven on a fresh drafter without ``reset()`` between requests, as engines do; then
    (1) no call may raise (an error is never agreement with a replay that raised too);
    (2) replaying the same call sequence on a fresh instance gives the same drafts, call for
    call; (3) after ``reset()`` the first drafter, driven through the session again, proposes
    exactly what the fresh one did.
    """
    requests = session_requests(context, other, prompt)
    first = make()
    recorded = walk_session(first, requests, k_at)
    broke = next((c for c in recorded if c.error is not None), None)
    if broke is not None:
        return [
            inv.violation(
                explanation=_raised(broke, f"a history-dependent drafter, on {broke.request} of a session"),
                actual=broke.draft,
                example=_session_example(requests, broke),
            )
        ], broke.number
    replayed = walk_session(make(), requests, k_at)
    for got, want in zip(replayed, recorded, strict=True):
        if got.draft != want.draft:
            return [
                inv.violation(
                    explanation="a history-dependent drafter replayed the same call sequence on a fresh instance and "
                    f"proposed differently on {got.request}, call {got.number} of the session (context length "
                    f"{got.length}) (not replayable)",
                    expected=want.draft,
                    actual=got.draft,
                    example=_session_example(requests, got),
                )
            ], 2 * len(recorded)
    reset = getattr(first, "reset", None)
    if not callable(reset):
        return [], 2 * len(recorded)
    reset()
    again = walk_session(first, requests, k_at)
    for got, want in zip(again, recorded, strict=True):
        if got.draft != want.draft:
            return [
                inv.violation(
                    explanation="after reset() a history-dependent drafter proposed differently than a fresh one "
                    f"along the same calls, on {got.request}, call {got.number} of the session (context length "
                    f"{got.length}) (reset() must start a new session)",
                    expected=want.draft,
                    actual=got.draft,
                    example=_session_example(requests, got),
                )
            ], 3 * len(recorded)
    return [], 3 * len(recorded)


def _first_change(before: Sequence[int], after: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(before, after)) if x != y), min(len(before), len(after)))


def check_no_mutation(
    inv: Invariant,
    drafter: Drafter,
    context: Sequence[int],
    ks: Sequence[int],
    *,
    other: Sequence[int] = (),
    prompt: int | None = None,
    accepts: Sequence[int] = (),
    vocab_size: int | None = None,
    coverage: Counter[str] | None = None,
) -> tuple[list[Violation], int]:
    """The context passed in is unchanged, at every call of a session of requests and of a relation walk.

    The drafter is driven through ``session_requests`` (a new prompt, another, an edit, a
    shorter prefix, a user turn appended; ``reset()`` before each request unless it declares
    ``history_dependent``, as engines do), one list per request extended in place; after
    every call that list, and every earlier request's list, must be what it was before.
    Then the same drafter is driven through a relation walk (``_relation_walk``), judged the
    same way at every call. Returns the violations and the number of calls checked.
    """
    if not context or not ks:
        return [], 0

    def k_at(length: int) -> int:
        return int(ks[length % len(ks)])

    n = len(context)
    requests = session_requests(context, other, max(1, min(n, prompt if prompt is not None else (n + 1) // 2)))
    found, number = _mutation_on_session(inv, drafter, requests, k_at)
    if found:
        return found, number
    walk = _walk(
        drafter, context, ks, other=other, prompt=prompt, accepts=accepts, vocab_size=vocab_size, coverage=coverage
    )
    found, checked = _mutation_on_walk(inv, walk)
    return found, number + checked


def _mutation_on_session(
    inv: Invariant, drafter: Drafter, requests: Sequence[Request], k_at: Callable[[int], int]
) -> tuple[list[Violation], int]:
    """``check_no_mutation`` on a session of requests: the first call that changed the list it was handed, or an
    earlier request's list, and the number of calls made."""
    declared = getattr(drafter, "history_dependent", False) is True
    reset = getattr(drafter, "reset", None)
    handed: list[tuple[Request, list[int], list[int]]] = []  # each request's list and what it must hold
    number = 0
    for request in requests:
        if callable(reset) and not declared:
            reset()
        live: list[int] = []
        handed.append((request, live, live))
        for length in request_lengths(request):
            live.extend(request.tokens[len(live) : length])
            before = list(live)
            handed[-1] = (request, live, before)
            number += 1
            propose_once(drafter, live, k_at(length))
            where = f"on {request.name}, call {number} of the session (context length {length}, k={k_at(length)})"
            for earlier, held, want in handed:
                if held == want:
                    continue
                i = _first_change(want, held)
                whose = "the context it was given" if earlier is request else f"the context of {earlier.name}"
                return [
                    inv.violation(
                        explanation=f"propose changed {whose} {where} (first change at index {i}, "
                        f"length {len(want)} -> {len(held)})",
                        expected=want[-16:],
                        actual=held[-16:],
                        example={
                            **_example(before, k_at(length)),
                            "request": request.name,
                            "requests": [r.name for r in requests],
                        },
                    )
                ], number
    return [], number


def _mutation_on_walk(inv: Invariant, walk: Sequence[WalkCall]) -> tuple[list[Violation], int]:
    """``check_no_mutation`` on a relation walk: the first call that changed a context, and the calls checked."""
    for i, at in enumerate(walk):
        if at.changed is None:
            continue
        whose, was, now = at.changed
        which = "the context it was given" if not whose else f"the context of an earlier request ({whose})"
        first = _first_change(was, now)
        return [
            inv.violation(
                explanation=f"propose changed {which} {_where(at)} (first change at index {first}, "
                f"length {len(was)} -> {len(now)})",
                expected=list(was[-16:]),
                actual=list(now[-16:]),
                example=_walk_example(walk, i),
            )
        ], i + 1
    return [], len(walk)
