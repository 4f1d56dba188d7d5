"""Is a continuation a loop? The figures that say whether a workload's numbers mean anything.

A greedy continuation that repeats itself ("the string the string ...", a run of spaces)
makes every drafter look good: the tokens per round measured on it are the drafter
predicting the loop, not the text. Two figures per continuation:

- ``distinct_ngram_share(tokens, 4)``: distinct 4-grams over all 4-grams (1.0: no 4-gram
  repeats; a run of one token: 1 / (len - 3));
- ``final_period(tokens)``: the smallest period ``p`` with which the continuation's last
  ``window`` tokens repeat (``tokens[i] == tokens[i - p]`` for each of them), or ``None``
  when it does not end in a loop of period at most ``window``.

A continuation is *degenerate* when its distinct 4-gram share is below
``DEGENERATE_SHARE``; the bench marks such workloads and leaves them out of its headline
figures (docs/bench.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from specproof.contract.validation import int_at_least

__all__ = ["DEGENERATE_SHARE", "PERIOD_WINDOW", "distinct_ngram_share", "final_period", "is_degenerate"]

DEGENERATE_SHARE: Final = 0.5
PERIOD_WINDOW: Final = 32


def distinct_ngram_share(tokens: Sequence[int], n: int = 4) -> float:
    """Distinct ``n``-grams of ``tokens`` over all of its ``n``-grams; 1.0 when it has none."""
    int_at_least(n, name="n", minimum=1, where="distinct_ngram_share")
    seq = [int(t) for t in tokens]
    total = len(seq) - n + 1
    if total <= 0:
        return 1.0
    return len({tuple(seq[i : i + n]) for i in range(total)}) / total


def final_period(tokens: Sequence[int], *, window: int = PERIOD_WINDOW) -> int | None:
    """The smallest ``p <= window`` such that the last ``window`` tokens each equal the token ``p`` before them."""
    int_at_least(window, name="window", minimum=1, where="final_period")
    seq = [int(t) for t in tokens]
    size = len(seq)
    for p in range(1, window + 1):
        if size < window + p:
            return None
        if all(seq[i] == seq[i - p] for i in range(size - window, size)):
            return p
    return None


def is_degenerate(tokens: Sequence[int]) -> bool:
    """Whether the continuation's distinct 4-gram share is below ``DEGENERATE_SHARE``."""
    return distinct_ngram_share(tokens, 4) < DEGENERATE_SHARE
