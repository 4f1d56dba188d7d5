"""Drafters whose bug shows only on the paths a decoder takes after the first request's first calls.

Feature heads over the zoo model (``head_drafter``), each broken on one path a plain walk
from length 1 never took:

- ``HeadKeepsChainAfterFullAccept``: after a *full* accept it keeps the draft chain's KV as the
  accepted positions' (the shape of vLLM #14649: the draft KV is not overwritten with the
  target's features); after a partial accept it is correct;
- ``HeadLazyResetKeepsLonger``: ``reset()`` is lazy, and the next request drops the held
  positions only when its prompt is no longer than them (the shape of SGLang #37326: state
  leaking into later requests over a server's uptime).

Their correct controls: ``HeadReprefills`` (keeps no head position between calls) and
``HeadLazyReset`` (a lazy reset done right).

Declared ``history_dependent`` drafters: ``SessionLookup`` (correct) drafts from the current
request or, most recent first, the session's earlier ones; ``RaisesOnShorterRequest`` raises
on a request that is a shorter prefix of the previous one; ``MutatesOnLaterRequest`` appends
the archived requests to the caller's list and, when the lookup hits, returns before
trimming them off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specproof.conformance.zoo._drafters import lookup_continuation
from specproof.engine.drafters.heads import HeadDrafter

Drafted = list[tuple[int, np.ndarray | None]]  # what HeadDrafter._draft returns: each token and its row

__all__ = [
    "HeadKeepsChainAfterFullAccept",
    "HeadLazyReset",
    "HeadLazyResetKeepsLonger",
    "HeadReprefills",
    "MutatesOnLaterRequest",
    "RaisesOnShorterRequest",
    "SessionLookup",
]


# ------------------------------------------------------------------------------------ feature heads


class HeadKeepsChainAfterFullAccept(HeadDrafter):
    """``drafter.deterministic``: a head that keeps its draft chain's KV after a full accept (vLLM #14649).

    The chain's positions are taken as the accepted ones, never recomputed from their features,
    so the next drafts attend to keys the chain computed from its own hidden states.
    """

    _chain: list[int] | None = None

    def _draft(self, context: Sequence[int], k: int, features: Mapping[int, np.ndarray] | None, pick: Any) -> Drafted:
        ctx = [int(t) for t in context]
        chain = self._chain
        if chain is not None and len(ctx) == len(chain) + 1 and ctx[: len(chain)] == chain:
            # the bug: every draft token was accepted, so the chain's positions are taken as computed
            self._n = len(chain) - 2
            self._toks = chain[:-1]
        out = super()._draft(context, k, features, pick)
        draft = [token for token, _ in out]
        self._chain = ctx + draft if len(draft) > 1 else None
        return out

    def reset(self) -> None:
        super().reset()
        self._chain = None


class HeadReprefills(HeadDrafter):
    """Correct, differently: keeps no head position between calls (every call recomputes the whole prefix)."""

    def _draft(self, context: Sequence[int], k: int, features: Mapping[int, np.ndarray] | None, pick: Any) -> Drafted:
        self._n, self._toks = 0, []
        return super()._draft(context, k, features, pick)


class HeadLazyReset(HeadDrafter):
    """Correct, differently: ``reset()`` only marks the held positions stale; the next call drops them all."""

    _stale = False

    def reset(self) -> None:
        if not hasattr(self, "_toks"):
            super().reset()  # the constructor's reset is a real one
            return
        self._stale = True

    def _drop_stale(self, context: Sequence[int]) -> None:
        super().reset()

    def _draft(self, context: Sequence[int], k: int, features: Mapping[int, np.ndarray] | None, pick: Any) -> Drafted:
        if self._stale:
            self._stale = False
            self._drop_stale(context)
        return super()._draft(context, k, features, pick)


class HeadLazyResetKeepsLonger(HeadLazyReset):
    """``drafter.deterministic``: a head whose lazy ``reset()`` leaks into a next prompt longer than it held.

    The next call drops the held positions only when its prompt is no longer than them; a
    longer prompt is taken to extend them (kept by length, not by token).
    """

    def _drop_stale(self, context: Sequence[int]) -> None:
        if len(context) <= len(self._toks):
            super()._drop_stale(context)
        else:  # the bug: "the new prompt covers what we hold, it will be overwritten as it is read"
            self._toks = [int(t) for t in context[: len(self._toks)]]


# ------------------------------------------------------------------------------------ session lookups


class SessionLookup:
    """Correct: a declared history-dependent lookup over the current request and, most recent first, the earlier
    ones (an edit archives only the previous request's tail past what the two share)."""

    history_dependent = True
    bug = "none (correct)"

    def __init__(self) -> None:
        self.name = f"specproof.zoo.{type(self).__name__}"
        self.reset()

    def __repr__(self) -> str:
        return f"<{self.name}; bug: {self.bug}>"

    def reset(self) -> None:
        self._archive: list[list[int]] = []
        self._current: list[int] = []

    def _shared(self, ctx: list[int]) -> int:
        """How many leading tokens a new request shares with the previous one."""
        return next(
            (i for i, (a, b) in enumerate(zip(ctx, self._current)) if a != b), min(len(ctx), len(self._current))
        )

    def _work(self, context: Sequence[int]) -> list[int]:
        return [int(t) for t in context]

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        ctx = [int(t) for t in context]
        if ctx[: len(self._current)] != self._current:  # not a continuation: a new request
            shared = self._shared(ctx)
            tail = self._current[max(0, shared - 1) :]
            if len(tail) > 1:
                self._archive.append(tail)
        self._current = ctx
        if k <= 0 or not ctx:
            return []
        own = lookup_continuation(ctx, k)
        if own or not self._archive:
            return own
        return self._from_archive(context, k)

    def _from_archive(self, context: Sequence[int], k: int) -> list[int]:
        work = self._work(context)
        n = len(work)
        for doc in reversed(self._archive):  # one pass over the archive, most recent request first
            work.extend(doc)
        last = work[n - 1]
        for i in range(n, len(work) - 1):
            if work[i] == last:
                hit = [int(t) for t in work[i + 1 : i + 1 + k]]
                return hit  # (MutatesOnLaterRequest: returns before trimming the archive off the list)
        del work[n:]
        return []


class RaisesOnShorterRequest(SessionLookup):
    """``drafter.deterministic``: a declared session lookup that raises on a shorter prefix of the last request.

    It finds where a new request leaves the previous one with ``next()`` and no default, so a
    request that is a prefix of the previous one raises ``StopIteration``.
    """

    bug = "raises StopIteration on a request that is a prefix of the previous one"

    def _shared(self, ctx: list[int]) -> int:
        return next(i for i, (a, b) in enumerate(zip(ctx, self._current)) if a != b)


class MutatesOnLaterRequest(SessionLookup):
    """``drafter.no-mutation``: a declared session lookup that appends to the caller's context on a later request.

    It appends the archived requests to the caller's list to search them in one pass, and
    returns before trimming them off when it finds a match.
    """

    bug = "appends earlier requests to the caller's context on a later request"

    def _work(self, context: Sequence[int]) -> list[int]:
        return context if isinstance(context, list) else [int(t) for t in context]
