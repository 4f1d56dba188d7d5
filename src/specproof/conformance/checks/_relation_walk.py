"""The relation walk: one drafter driven through every relation of the coverage model of requests.

``relation_walk`` calls one drafter instance the way engines serving many requests do, in
an order built so that every call's relation to the call before it (``relation_of``,
``specproof.strategies``) reaches each relation of the model at least once on any drawn
example: a new prompt; the same prompt again with k larger, smaller and equal; the prompt
extended by some of its own draft; decoder rounds (accepted draft tokens and a bonus
token); an equal block after a different prefix; an edit in the second half and in the
first half; a shorter prefix; an unrelated prompt; and, after ``reset()`` (where the
drafter has one), the same context again and a user turn on it; last a call with ``k=0``.
Each request gets a list of its own, extended in place within the request. Every call is
recorded (``WalkCall``: where, what came back raw, its relation tags, and whether it
changed a list it was handed), so each per-call invariant judges every call of one walk.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import attrs

from specproof.conformance.checks._drafter_walks import Call, comparable, propose_raw
from specproof.engine import Drafter
from specproof.strategies import K_RELATIONS as K_TAGS
from specproof.strategies import REQUEST_RELATIONS as RELATIONS
from specproof.strategies import RESET_RELATIONS as RESET_TAGS
from specproof.strategies import SHARED_BLOCK, RelationTracker

__all__ = ["WalkCall", "applicable_tags", "relation_walk"]

_ROUNDS = 4  # decoder rounds (accepted draft tokens and a bonus): the context grows past a shared block


@attrs.frozen
class WalkCall:
    """One call of the walk: ``call`` (number, length, k, comparable draft, error; ``request`` says what
    the walk did), the context it was handed, the raw return, its relation tags, and the first list
    handed so far that the call changed: ``(whose, what it held before, what it holds now)``, ``whose``
    empty for the list of the call itself, else the step that was handed it."""

    call: Call
    context: tuple[int, ...]
    raw: object
    tags: tuple[str, ...]
    changed: tuple[str, tuple[int, ...], tuple[int, ...]] | None = None


def applicable_tags(drafter: object) -> tuple[str, ...]:
    """The coverage tags a walk of ``drafter`` must reach: the reset ones only where it has ``reset()``."""
    has_reset = callable(getattr(drafter, "reset", None))
    return (*RELATIONS, *(RESET_TAGS if has_reset else ()), *K_TAGS)


class _Walker:
    def __init__(self, drafter: Drafter, vocab: int, k_at: Callable[[int], int]) -> None:
        self.drafter = drafter
        self.vocab = vocab
        self.k_at = k_at
        self.tracker = RelationTracker()
        self.calls: list[WalkCall] = []
        self.handed: list[tuple[str, list[int], tuple[int, ...]]] = []  # every list handed, and what it held
        self.live: list[int] = []
        self.draft: list[int] = []

    def diverge(self, tok: int) -> int:
        return (int(tok) + 1) % self.vocab

    def new(self, tokens: Sequence[int], what: str, k: int | None = None) -> None:
        """A new request: a list of its own holding ``tokens``, called at once."""
        self.live = [int(t) for t in tokens]
        self.handed.append((what, self.live, tuple(self.live)))
        self.ask(what, k)

    def grow(self, tokens: Sequence[int], what: str) -> None:
        """The current request's list extended in place, then called."""
        self.live.extend(int(t) for t in tokens)
        self.handed[-1] = (self.handed[-1][0], self.live, tuple(self.live))
        self.ask(what)

    def ask(self, what: str, k: int | None = None) -> None:
        live = self.live
        before = tuple(live)
        k = self.k_at(len(before)) if k is None else k
        raw, error = propose_raw(self.drafter, live, k)
        draft, error, ints = comparable(raw, error)
        changed = None
        for whose, held, want in self.handed:
            if tuple(held) != want:
                changed = ("" if held is live else whose, want, tuple(held))
                held[:] = want  # the walk goes on with what the list held (no-mutation reports the change)
                break
        valid = ints[: next((j for j, t in enumerate(ints) if t >= self.vocab), len(ints))]
        tags = self.tracker.call(before, valid, k=k)
        call = Call(number=len(self.calls) + 1, length=len(before), k=k, draft=draft, error=error, request=what)
        self.calls.append(WalkCall(call, before, raw, tuple(tags), changed))
        self.draft = valid

    def reset(self) -> str:
        reset = getattr(self.drafter, "reset", None)
        if not callable(reset):
            return "with no reset() (the drafter has none)"
        reset()
        self.tracker.reset()
        return "after reset()"


def relation_walk(
    drafter: Drafter,
    context: Sequence[int],
    other: Sequence[int],
    *,
    prompt: int,
    ks: Sequence[int],
    accepts: Sequence[int],
    vocab_size: int | None = None,
) -> tuple[list[WalkCall], Counter[str]]:
    """Drive ``drafter`` through the walk of the module docstring; its calls and the relation tags reached
    (every applicable tag present, those never reached at 0)."""
    ctx = [int(t) for t in context]
    oth = [int(t) for t in other] or ctx
    vocab = int(vocab_size) if vocab_size is not None else max([*ctx, *oth]) + 2
    kinds = [int(k) for k in ks] or [1]
    w = _Walker(drafter, vocab, lambda length: kinds[length % len(kinds)])
    n = len(ctx)
    p = max(1, min(prompt, n))
    ka = kinds[0]
    w.new(ctx[:p], f"a new prompt of {p} tokens", ka)
    for k, how in ((ka + 1, "larger"), (ka, "smaller"), (ka, "equal")):
        w.new(ctx[:p], f"the same prompt again, k={k} ({how} than before)", k)
    if w.draft:
        m = max(1, min(int(accepts[0]) if accepts else 1, len(w.draft)))
        w.grow(w.draft[:m], f"extended by {m} of its drafted token(s)")
    nxt = p
    for j in range(_ROUNDS):
        if w.draft and not w.tracker.counts["extension"]:
            w.grow(w.draft[:1], "extended by 1 of its drafted tokens")
        kept = w.draft[: max(0, int(accepts[(j + 1) % len(accepts)]))] if accepts else []
        bonus = ctx[nxt] if nxt < n else oth[j % len(oth)]
        if len(kept) < len(w.draft) and bonus == w.draft[len(kept)]:
            bonus = w.diverge(bonus)  # the target's token after a rejected draft token is another one
        nxt += 1
        w.grow([*kept, bonus], f"a decoder round: {len(kept)} drafted token(s) accepted and a bonus token")
    held = list(w.live)
    split = max(1, len(held) - SHARED_BLOCK - 2)
    if len(held) >= split + SHARED_BLOCK:
        block = [w.diverge(t) for t in held[:split]] + held[split:]
        w.new(block, f"{split} different tokens, then the previous context's tokens at the same positions")
    for early in (False, True):
        held = list(w.live)
        g = len(held)
        cut = (g - 1) // 2 if early else max((g + 1) // 2, g - 2)
        if 1 <= cut < g:
            edited = [*held[:cut], w.diverge(held[cut]), *oth[:3]]
            w.new(edited, f"an edit of the previous context at position {cut} of {g}")
            w.grow(oth[:1], "one more token")
    if len(w.live) >= 2:
        w.new(w.live[: len(w.live) // 2], f"a shorter prefix ({len(w.live) // 2} of {len(w.live)} tokens)")
    unrelated = oth[: max(1, len(oth) // 2)]
    if unrelated[0] == w.live[0]:
        unrelated = [w.diverge(unrelated[0]), *unrelated[1:]]
    w.new(unrelated, "an unrelated prompt")
    how = w.reset()
    w.new(list(w.live), f"the same context again, {how}")
    turn = w.diverge(w.draft[0]) if w.draft else oth[0]
    how = w.reset()
    w.new([*w.live, turn], f"the previous context and a user turn, {how}")
    w.ask("the same context, asked for k=0 tokens", 0)
    # ``extension`` grows a context by the drafter's own draft: a walk where it drafted nothing cannot reach it
    drafted = any(c.call.draft for c in w.calls)
    counts: Counter[str] = Counter({tag: 0 for tag in applicable_tags(drafter) if drafted or tag != "extension"})
    counts.update(w.tracker.counts)
    return w.calls, counts
