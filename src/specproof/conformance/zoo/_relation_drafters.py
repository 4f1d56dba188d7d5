"""Drafters whose bug shows only on one relation of a request to the one before (the coverage model).

Each is the prompt-lookup control (``LookupDrafter``) with state kept between calls, broken
where a walk of one growing context never goes:

- ``DepthGrowsOverRequests``: its draft depth adapts upward with every new request, past ``k``
  after three (an adaptive-depth drafter whose cap is applied before the adaptation);
- ``DraftCacheIgnoresK``: caches each context's draft and serves it again whatever ``k`` is
  asked, so a smaller ``k`` at the same context gets the longer draft;
- ``ResetKeepsIndexPointer``: an incremental index whose ``reset()`` clears the index but keeps
  the pointer to the context it indexed, so a regenerate or a user turn after ``reset()``
  indexes nothing (or only the turn);
- ``EarlyEditKeepsIndex``: an incremental index that cuts itself back on an edit in the second
  half of the context it held, but keeps its stale entries on an edit in the first half.

Their correct control, differently: ``IncrementalLookup`` (the incremental index done right:
it cuts back to the common prefix on every relation, and ``reset()`` forgets everything).
"""

from __future__ import annotations

from collections.abc import Sequence

from specproof.conformance.zoo._drafters import LookupDrafter, lookup_continuation

__all__ = [
    "DepthGrowsOverRequests",
    "DraftCacheIgnoresK",
    "EarlyEditKeepsIndex",
    "IncrementalLookup",
    "ResetKeepsIndexPointer",
]


def _extends(context: Sequence[int], held: Sequence[int]) -> bool:
    return len(context) >= len(held) and list(context[: len(held)]) == list(held)


class DepthGrowsOverRequests(LookupDrafter):
    """``drafter.max-length``: its draft depth grows with every new request, past ``k`` after three.

    Shipped as: an adaptive-depth drafter that raises its depth while acceptance is high and
    clamps it to ``k`` only when it is first configured, so after a few requests it proposes
    more tokens than the engine asked for (a later request's verify then overruns).
    """

    bug = "the draft depth grows with every request, past k after three"

    def __init__(self) -> None:
        super().__init__()
        self._held: list[int] = []
        self._requests = 0

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        ctx = [int(t) for t in context]
        if not _extends(ctx, self._held):
            self._requests += 1  # a new request: the context does not continue the last one
        self._held = ctx
        if k <= 0:
            return []
        depth = k + self._requests // 3
        draft = lookup_continuation(ctx, depth)
        return draft + [ctx[-1]] * (depth - len(draft)) if depth > k else draft


class DraftCacheIgnoresK(LookupDrafter):
    """``drafter.max-length``: serves a context's cached draft again whatever ``k`` is asked.

    Shipped as: a draft cache keyed by the context alone (a regenerate or a retried request
    hits it), the cached draft returned without being cut to the new, smaller ``k``.
    """

    bug = "a cached draft is served again at a smaller k, not cut to it"

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[tuple[int, ...], list[int]] = {}

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        key = tuple(int(t) for t in context)
        if key not in self._cache:
            self._cache[key] = lookup_continuation(context, k)
        return list(self._cache[key])


class IncrementalLookup(LookupDrafter):
    """Correct, differently: prompt lookup over an index of the context it holds, kept between calls.

    The index maps each token to the positions it was seen at; a call on a context that extends
    the held one indexes only the new tokens, any other is cut back to the common prefix first;
    ``reset()`` forgets the index and the context.
    """

    bug = "none (an incremental index kept between calls, cut back right)"

    def __init__(self) -> None:
        super().__init__()
        self._held: list[int] = []
        self._index: dict[int, list[int]] = {}

    def reset(self) -> None:
        self._held = []
        self._index = {}

    def _cut(self, keep: int) -> None:
        """Forget every indexed position from ``keep`` on."""
        self._index = {t: [p for p in ps if p < keep] for t, ps in self._index.items()}
        self._held = self._held[:keep]

    def _sync(self, ctx: list[int]) -> None:
        if not _extends(ctx, self._held):
            common = next(
                (i for i, (a, b) in enumerate(zip(ctx, self._held)) if a != b), min(len(ctx), len(self._held))
            )
            self._cut(common)
        for p in range(len(self._held), len(ctx)):
            self._index.setdefault(ctx[p], []).append(p)
        self._held = list(ctx)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        ctx = [int(t) for t in context]
        self._sync(ctx)
        if k <= 0 or len(ctx) < 2:
            return []
        earlier = [p for p in self._index.get(ctx[-1], ()) if p < len(ctx) - 1]
        if not earlier:
            return []
        start = max(earlier)
        return [int(t) for t in ctx[start + 1 : start + 1 + k]]


class ResetKeepsIndexPointer(IncrementalLookup):
    """``drafter.deterministic``: ``reset()`` clears the index but keeps the context it had indexed.

    Shipped as: a lazy reset that drops the lookup table and forgets to drop the "already
    indexed up to" pointer, so a regenerate right after ``reset()`` (the same prompt again)
    indexes nothing and a user turn indexes only the turn.
    """

    bug = "reset() keeps the indexed context: a regenerate after reset() finds no earlier occurrence"

    def reset(self) -> None:
        self._index = {}


class EarlyEditKeepsIndex(IncrementalLookup):
    """``drafter.deterministic``: an edit in the first half of the held context keeps the stale index.

    Shipped as: an incremental index that cuts itself back on a late edit (a rejected draft,
    a regenerated answer) but treats an early edit as too costly to cut and just appends,
    its stale positions pointing at tokens the new context no longer has there.
    """

    bug = "an edit in the first half of the held context keeps the index's stale positions"

    def _sync(self, ctx: list[int]) -> None:
        held = self._held
        common = next((i for i, (a, b) in enumerate(zip(ctx, held)) if a != b), min(len(ctx), len(held)))
        if 0 < common < len(ctx) and 2 * common < len(held):
            for p in range(len(held), len(ctx)):  # the early edit: stale entries kept, only the tail indexed
                self._index.setdefault(ctx[p], []).append(p)
            self._held = list(ctx)
            return
        super()._sync(ctx)
