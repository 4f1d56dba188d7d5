"""Prompt-lookup drafting: continue the longest suffix that occurred earlier in the context."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least

__all__ = ["NgramDrafter", "naive_ngram_propose"]

Prefer = Literal["recent", "earliest"]


class NgramDrafter:
    """Prompt lookup with an incremental n-gram index.

    For n from ``max_n`` down to ``min_n``, find the last n context tokens earlier in
    the context; propose up to ``k`` tokens that followed its most recent
    (``prefer="recent"``) or first (``prefer="earliest"``) earlier occurrence.
    When that continuation runs into the end of the context (the match is ``p``
    tokens back and ``p < k``), it is extended by the match's period ``p``: the
    context is read as repeating, so a run of one token proposes ``k`` copies and a
    period-3 loop ``k`` tokens of the loop. ``extend=False`` keeps the cut draft
    (``CombinedDrafter`` lets its draft model complete it instead).

    The index maps each n-gram to where its continuation starts and is updated
    with only the tokens added since the last call, so a proposal costs the same
    at 64K tokens of context as at 1K. A context that does not extend the last one
    seen (a new conversation without ``reset()``) is detected and the index rebuilt.

    Deterministic under sampling too: it has no ``propose_sampled``, so a sampled generation
    (docs/contract.md, "Sampling") uses its ``propose`` with a one-hot ``q`` (each token proposed
    with certainty given the context); rejection sampling then keeps a token with probability ``p``.
    """

    def __init__(self, min_n: int = 1, max_n: int = 3, prefer: Prefer = "recent", *, extend: bool = True) -> None:
        for field, value in (("min_n", min_n), ("max_n", max_n)):
            int_at_least(value, name=field, minimum=1, where="NgramDrafter")
        if min_n > max_n:
            raise InvalidSettingError(f"NgramDrafter min_n={min_n} must not exceed max_n={max_n}")
        if prefer not in ("recent", "earliest"):
            raise InvalidSettingError(f"NgramDrafter prefer={prefer!r} is not 'recent' or 'earliest'")
        if not isinstance(extend, bool):
            raise InvalidSettingError(f"NgramDrafter extend must be True or False, got {extend!r}")
        self.min_n = min_n
        self.max_n = max_n
        self.prefer: Prefer = prefer
        self.extend = extend
        suffix = "" if extend else ", extend=False"
        self.name = f"specproof.NgramDrafter(min_n={min_n}, max_n={max_n}, prefer={prefer}{suffix})"
        self.reset()

    def __repr__(self) -> str:
        suffix = "" if self.extend else ", extend=False"
        return f"NgramDrafter(min_n={self.min_n}, max_n={self.max_n}, prefer={self.prefer!r}{suffix})"

    def reset(self) -> None:
        self._tokens: list[int] = []
        # _index[n - min_n][ngram] = position where the token following that n-gram sits
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.min_n, self.max_n + 1)]
        self._source: object = None

    def _sync(self, context: Sequence[int]) -> None:
        seen = len(self._tokens)
        if (
            len(context) < seen
            or (context is not self._source and list(context[:seen]) != self._tokens)
            or (seen and context[seen - 1] != self._tokens[-1])
        ):
            self.reset()
            seen = 0
        self._source = context
        if len(context) == seen:
            return
        tokens = self._tokens
        recent = self.prefer == "recent"
        for tok in context[seen:]:
            pos = len(tokens)  # the new token's position: the continuation of n-grams ending just before it
            for slot, n in enumerate(range(self.min_n, self.max_n + 1)):
                if pos >= n:
                    key = tuple(tokens[pos - n : pos])
                    table = self._index[slot]
                    if recent or key not in table:
                        table[key] = pos
            tokens.append(int(tok))

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        self._sync(context)
        tokens = self._tokens
        size = len(tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            start = self._index[n - self.min_n].get(tuple(tokens[size - n :]))
            if start is not None:
                period = size - start  # the earlier occurrence ends `period` tokens back
                if period >= k or not self.extend:
                    return tokens[start : start + k]
                loop = tokens[start:size]
                return (loop * (k // period + 1))[:k]
        return []


def naive_ngram_propose(
    context: Sequence[int],
    k: int,
    *,
    min_n: int = 1,
    max_n: int = 3,
    prefer: Prefer = "recent",
    extend: bool = True,
) -> list[int]:
    """The same rule as ``NgramDrafter`` by a full rescan: the oracle its tests compare with.

    Extension by the period is written token by token: draft token ``i`` is the
    token ``period`` positions before it in context + draft.
    """
    tokens = list(context)
    size = len(tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, size), min_n - 1, -1):
        suffix = tokens[size - n :]
        starts = [s for s in range(0, size - n) if tokens[s : s + n] == suffix]
        if starts:
            s = starts[-1] if prefer == "recent" else starts[0]
            period = size - (s + n)
            if not extend:
                return tokens[s + n : s + n + k]
            extended = list(tokens)
            for _ in range(k):
                extended.append(extended[-period])
            return extended[size:]
    return []
