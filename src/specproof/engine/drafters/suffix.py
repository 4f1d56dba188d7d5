"""A drafter that learns across calls: suffix matching over the session's earlier requests and outputs.

SuffixDecoding-style (docs/contract.md, "Drafters that learn across calls"): the drafter keeps
every context it has been shown in the session — the current one, growing call by call, and
the final contexts of earlier requests (prompt plus output) — and drafts what followed the
longest suffix of the context (``max_n`` tokens down to ``min_n``) that occurs in that history,
preferring the current request, then the most recent earlier one. A match in the current request
whose continuation runs into the end of the context is continued by its period, so a loop is
drafted k tokens deep. A request that repeats or
edits an earlier one is drafted from it.

Its drafts depend on the calls it has seen, so it declares ``history_dependent = True``:
``drafter.deterministic`` then requires the same call sequence to give the same drafts and
``reset()`` to give a fresh drafter (a new session), not history-independence; engines do
not reset it between the requests of a session.
"""

from __future__ import annotations

from collections.abc import Sequence

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least

__all__ = ["SuffixDrafter"]


class SuffixDrafter:
    """``SuffixDrafter(*, min_n=2, max_n=16, max_requests=64)``.

    The history is an index from each n-gram (``min_n <= n <= max_n``) to its latest end in
    each document (earlier requests, then the current one). Counters: ``proposals``,
    ``history_drafts`` (drafted from an earlier request), ``current_drafts``, ``requests``.

    Deterministic under sampling too: no ``propose_sampled``, so a sampled generation uses
    ``propose`` with a one-hot ``q`` (docs/contract.md, "Sampling").
    """

    history_dependent = True

    def __init__(self, *, min_n: int = 2, max_n: int = 16, max_requests: int = 64) -> None:
        for name, value, low in (("min_n", min_n, 1), ("max_n", max_n, 1), ("max_requests", max_requests, 1)):
            int_at_least(value, name=name, minimum=low, where="SuffixDrafter")
        if max_n < min_n:
            raise InvalidSettingError(f"SuffixDrafter max_n={max_n} is below min_n={min_n}")
        self.min_n, self.max_n, self.max_requests = min_n, max_n, max_requests
        self.name = f"specproof.SuffixDrafter(min_n={min_n}, max_n={max_n})"
        self.reset()

    def __repr__(self) -> str:
        return f"SuffixDrafter(min_n={self.min_n}, max_n={self.max_n}, requests={len(self._docs)})"

    def reset(self) -> None:
        """A new session: forget every request (a fresh drafter)."""
        self._docs: list[list[int]] = []  # earlier requests' final contexts, oldest first
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> (doc number << 32) | end, latest wins
        self._cur: list[int] = []
        self._source: Sequence[int] | None = None  # the sequence object the last call was given
        self._cur_index: dict[tuple[int, ...], int] = {}  # n-gram -> end in the current context
        self.proposals = 0
        self.history_drafts = 0
        self.current_drafts = 0
        self.requests = 0

    def _add(
        self, index: dict[tuple[int, ...], int], doc: Sequence[int], start: int, tag: int, stop: int | None = None
    ) -> None:
        """Index the n-grams of ``doc`` that end at positions ``start <= end <= stop`` (exclusive end), tagged."""
        last = len(doc) if stop is None else stop
        for end in range(max(start, self.min_n), last + 1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                index[tuple(doc[end - n : end])] = (tag << 32) | end

    def _archive(self) -> None:
        if len(self._cur) >= 2:
            self._docs.append(self._cur)
            if len(self._docs) > self.max_requests:
                self._docs.pop(0)
                self._index = {}
                for i, doc in enumerate(self._docs):
                    self._add(self._index, doc, 0, i)
            else:
                self._add(self._index, self._cur, 0, len(self._docs) - 1)
        self._cur = []
        self._cur_index = {}

    def _follow(self, context: Sequence[int]) -> None:
        """Make ``context`` the current request: extend it, or archive the old one and start anew."""
        n = len(self._cur)
        # the same growing list the last call saw needs no full comparison (a proposal then costs
        # the same at 64K tokens as at 1K); any other sequence is compared token by token
        same = context is self._source and len(context) >= n and (not n or context[n - 1] == self._cur[-1])
        self._source = context
        if n and len(context) >= n and (same or list(context[:n]) == self._cur):
            new = [int(t) for t in context[n:]]
        else:
            self._archive()
            self.requests += 1
            new = [int(t) for t in context]
        if new:
            start = len(self._cur)
            self._cur.extend(new)
            # an n-gram ending at the very end has no continuation yet: index ends up to len - 1 only,
            # and re-index the previous last end now that it has one
            self._add(self._cur_index, self._cur, max(start - 1, 0), 0, stop=len(self._cur) - 1)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0 or not context:
            return []
        self.proposals += 1
        self._follow(context)
        cur = self._cur
        for n in range(min(self.max_n, len(cur)), self.min_n - 1, -1):
            key = tuple(cur[len(cur) - n :])
            hit = self._cur_index.get(key)
            if hit is not None:
                # a match in the current context may run into its end: continue it by its period
                # (the suffix recurs every len(cur) - end tokens), as the n-gram drafter does
                end = hit & 0xFFFFFFFF
                period = len(cur) - end
                self.current_drafts += 1
                return [cur[end + i % period] for i in range(k)]
            hit = self._index.get(key)
            if hit is not None:
                doc, end = self._docs[hit >> 32], hit & 0xFFFFFFFF
                if end < len(doc):
                    self.history_drafts += 1
                    return doc[end : end + k]
        return []
