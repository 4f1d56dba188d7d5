"""How the drafter checks drive a drafter: decoder-shaped walks over one context, and sessions of requests.

A *walk* calls one drafter instance the way a decoder does: one list, extended in place,
and a proposal at each chosen position. Every call is recorded as a ``Call`` (what it
proposed, or what it raised), so a check can compare two walks call for call, or a walk
with fresh drafters asked once. A *session* is a sequence of requests (``Request``): each
starts with its whole prompt, then grows one token per call, in a list of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Integral

import attrs
import numpy as np

from specproof.engine import Drafter
from specproof.engine.conventions import draft_sequence_problem

__all__ = [
    "Call",
    "Request",
    "decoder_walk",
    "FreshDrafts",
    "propose_once",
    "request_lengths",
    "session_requests",
    "walk_positions",
    "walk_session",
]

KAt = Callable[[int], int]


@attrs.frozen
class Call:
    """One proposal: where (request, call number, context length, k) and what came back.

    ``draft`` is comparable: the draft's tokens (ints compare as ints), or ``("not a
    sequence", type)``; ``error`` is the ``repr`` of what ``propose`` raised (``draft`` is
    then ``("raised", error)``).
    """

    number: int  # 1-based, within the walk
    length: int
    k: int
    draft: object
    error: str | None = None
    request: str = ""


@attrs.frozen
class Request:
    """One request of a session: its whole context and the length of its prompt (the first call's)."""

    name: str
    tokens: tuple[int, ...]
    prompt: int


def _canonical(tok: object) -> object:
    """Ints compare as ints (numpy ints included); anything else by its repr."""
    return int(tok) if isinstance(tok, Integral) else repr(tok)


def propose_raw(drafter: Drafter, live: list[int], k: int) -> tuple[object, str | None]:
    """``drafter.propose(live, k)`` as returned, and the repr of what it raised (or None)."""
    try:
        return drafter.propose(live, k), None
    except Exception as exc:  # a drafter that raises breaks every invariant it is asked about
        return None, repr(exc)


def comparable(raw: object, error: str | None) -> tuple[object, str | None, list[int]]:
    """A proposal as ``propose_once`` gives it: the comparable draft, the error, and its valid int tokens."""
    if error is not None:
        return ("raised", error), error, []
    if draft_sequence_problem(raw) is not None:
        return ("not a sequence", type(raw).__name__), None, []
    tokens = list(raw)  # type: ignore[call-overload]
    ints: list[int] = []
    for tok in tokens:
        if not isinstance(tok, Integral) or isinstance(tok, (bool, np.bool_)) or int(tok) < 0:
            break
        ints.append(int(tok))
    return [_canonical(t) for t in tokens], None, ints


def propose_once(drafter: Drafter, live: list[int], k: int) -> tuple[object, str | None, list[int]]:
    """``drafter.propose(live, k)``: the comparable draft, the error's repr (or None), and its valid int tokens."""
    return comparable(*propose_raw(drafter, live, k))


def walk_positions(
    drafter: Drafter,
    context: Sequence[int],
    positions: Sequence[int],
    k_at: KAt,
    *,
    request: str = "",
    first_number: int = 1,
) -> list[Call]:
    """One list extended in place, a proposal at each of ``positions`` (increasing context lengths)."""
    live: list[int] = []
    calls: list[Call] = []
    for number, length in enumerate(positions, start=first_number):
        live.extend(context[len(live) : length])
        draft, error, _ = propose_once(drafter, live, k_at(length))
        calls.append(Call(number=number, length=length, k=k_at(length), draft=draft, error=error, request=request))
    return calls


def decoder_walk(
    drafter: Drafter,
    context: Sequence[int],
    prompt: int,
    accepts: Sequence[int],
    k_at: KAt,
    *,
    vocab_size: int | None = None,
) -> tuple[list[int], list[Call]]:
    """Drive ``drafter`` as a decoder does and return the context it built and its calls.

    The first call is the whole prompt ``context[:prompt]``; after each call the next
    ``accepts[i]`` tokens of the draft are kept (all of them when it is at least the
    draft's length: a full accept) and one more token (the bonus, the next token of
    ``context`` not yet used) is appended, so the draft chains a drafter keeps after an
    accept are reached. It stops once the built context is as long as ``context``.
    """
    n = len(context)
    live = [int(t) for t in context[: max(1, min(prompt, n))]]
    calls: list[Call] = []
    bonus = len(live)
    for i in range(n + 1):
        length = len(live)
        draft, error, tokens = propose_once(drafter, live, k_at(length))
        calls.append(Call(number=i + 1, length=length, k=k_at(length), draft=draft, error=error))
        if length >= n or bonus >= n:
            break
        if vocab_size is not None:
            tokens = tokens[: next((j for j, t in enumerate(tokens) if t >= vocab_size), len(tokens))]
        kept = tokens[: max(0, int(accepts[i % len(accepts)]))] if accepts else []
        live.extend(kept)
        live.append(int(context[bonus]))
        bonus += 1
    return live, calls


class FreshDrafts:
    """What a fresh drafter asked once proposes at each length of ``context`` (the definition of the answer).

    Each length is asked of its own new drafter the first time it is looked up, then remembered.
    """

    def __init__(self, make: Callable[[], Drafter], context: Sequence[int], k_at: KAt) -> None:
        self.make = make
        self.context = [int(t) for t in context]
        self.k_at = k_at
        self._drafts: dict[int, tuple[object, str | None]] = {}

    def __call__(self, length: int) -> tuple[object, str | None]:
        """The fresh drafter's draft at ``context[:length]`` and what it raised (or None)."""
        if length not in self._drafts:
            draft, error, _ = propose_once(self.make(), self.context[:length], self.k_at(length))
            self._drafts[length] = (draft, error)
        return self._drafts[length]


def session_requests(context: Sequence[int], other: Sequence[int], prompt: int) -> list[Request]:
    """A session built from two drawn contexts: a new prompt, another, an edit, a shorter prefix, a user turn.

    Each request is what a client of one engine sends next: an unrelated request; the
    context (its prompt ``context[:prompt]``); an edit of it (its first half kept, the rest
    replaced); a shorter prefix of an earlier request (regenerated); and the last request
    with a user turn appended to it.
    """
    ctx = [int(t) for t in context]
    oth = [int(t) for t in other] or ctx
    n = len(ctx)
    p = max(1, min(prompt, n))
    out = [
        Request("a new request (an unrelated prompt)", tuple(oth), max(1, len(oth) // 2)),
        Request("a new request", tuple(ctx), p),
    ]
    keep = max(1, n // 2)
    edited = ctx[:keep] + [t for t in oth[: max(1, n - keep)]]
    out.append(Request(f"an edit of the previous request (its first {keep} tokens kept)", tuple(edited), keep + 1))
    short = max(1, min(keep, p) - 1) if n > 1 else 1
    regrown = ctx[: min(n, short + 4)]
    out.append(Request(f"a shorter prefix of an earlier request ({short} of its tokens)", tuple(regrown), short))
    turn = oth[: max(1, min(len(oth), 6))]
    appended = regrown + turn + ctx[:4]
    out.append(Request("the previous request with a user turn appended", tuple(appended), len(regrown) + len(turn)))
    return out


def request_lengths(request: Request) -> range:
    """The context lengths a request is called at: its whole prompt first, then one more token per call."""
    return range(request.prompt, len(request.tokens) + 1)


def walk_session(
    drafter: Drafter, requests: Sequence[Request], k_at: KAt, *, reset_between: bool = False
) -> list[Call]:
    """Every request in turn on one drafter (``reset()`` before each when ``reset_between``), call by call."""
    calls: list[Call] = []
    for request in requests:
        if reset_between:
            reset = getattr(drafter, "reset", None)
            if callable(reset):
                reset()
        calls.extend(
            walk_positions(
                drafter,
                request.tokens,
                list(request_lengths(request)),
                k_at,
                request=request.name,
                first_number=len(calls) + 1,
            )
        )
    return calls
