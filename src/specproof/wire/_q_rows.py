"""The suite drafter's proposal distribution on the wire: a ``draft`` message's ``q`` rows
(docs/protocol.md, Sampling).

Each row is the distribution its draft token was drawn from, sent sparse: the ``[token, probability]``
pairs of its non-zero entries in increasing token order. A draft without ``q`` has every row one-hot on
its token (a deterministic drafter). Both directions are bounded (``MAX_Q_PAIRS`` pairs a message) and
checked before any row is built: ``encode_q_rows`` on the client, ``decode_q_rows`` in an engine
written in Python (the test engine uses it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.wire._limits import MAX_Q_PAIRS

__all__ = ["Q_SUM_TOLERANCE", "decode_q_rows", "encode_q_rows"]

#: how far a row's probabilities may sum from 1 (the drafter contract's tolerance, float64 sums)
Q_SUM_TOLERANCE = 1e-6


def encode_q_rows(q: np.ndarray, tokens: Sequence[int]) -> list[list[list[float | int]]] | None:
    """The ``q`` field for a draft of ``tokens`` drawn from the rows of ``q`` ([len(tokens), vocab]):
    ``[[[token, probability], ...], ...]``, or None when every row is one-hot on its token (the field
    is then left out). More than ``MAX_Q_PAIRS`` non-zero entries is an ``InvalidSettingError``."""
    rows = np.asarray(q, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] != len(tokens):
        raise InvalidSettingError(f"q of shape {rows.shape} for a draft of {len(tokens)} tokens")
    nonzero = int(np.count_nonzero(rows > 0.0))
    if nonzero > MAX_Q_PAIRS:
        raise InvalidSettingError(
            f"the drafter's q rows have {nonzero} non-zero entries, more than the {MAX_Q_PAIRS} one draft message "
            "may carry (docs/protocol.md, Limits): make them sparser (top_k, top_p)"
        )
    if all(rows[i, t] == 1.0 and np.count_nonzero(rows[i]) == 1 for i, t in enumerate(tokens)):
        return None
    out: list[list[list[float | int]]] = []
    for row in rows:
        (ids,) = np.nonzero(row > 0.0)
        out.append([[int(t), float(row[t])] for t in ids])
    return out


def decode_q_rows(rows: object, tokens: Sequence[int], vocab_size: int) -> np.ndarray:
    """The dense ``q`` ([len(tokens), vocab_size], float64) a draft message's ``q`` field stands for (None:
    one-hot rows); a ``ValueError`` naming the first problem — the wrong row count, more than
    ``MAX_Q_PAIRS`` pairs, a token outside the vocabulary or repeated in a row, a probability outside
    (0, 1], a row that does not sum to 1, a draft token its row gives no mass — before the array is built."""
    n = len(tokens)
    if rows is None:
        out = np.zeros((n, vocab_size))
        out[np.arange(n), list(tokens)] = 1.0
        return out
    if not isinstance(rows, list) or len(rows) != n:
        got = len(rows) if isinstance(rows, list) else type(rows).__name__
        raise ValueError(f"draft q has {got} rows for {n} draft tokens (one row per token)")
    total = sum(len(r) if isinstance(r, list) else 0 for r in rows)
    if total > MAX_Q_PAIRS:
        raise ValueError(f"draft q holds {total} pairs, more than the limit {MAX_Q_PAIRS}")
    out = np.zeros((n, vocab_size))
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not row:
            raise ValueError(f"draft q[{i}] must be a non-empty list of [token, probability] pairs")
        for pair in row:
            ok = isinstance(pair, list) and len(pair) == 2
            token, prob = (pair[0], pair[1]) if ok else (None, None)
            if not ok or isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                raise ValueError(
                    f"draft q[{i}] has the pair {pair!r}: expected [token in [0, {vocab_size}), probability]"
                )
            if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0.0 < prob <= 1.0:
                raise ValueError(f"draft q[{i}] gives token {token} the probability {prob!r}, not in (0, 1]")
            if out[i, token] != 0.0:
                raise ValueError(f"draft q[{i}] names token {token} twice")
            out[i, token] = float(prob)
        mass = math.fsum(float(p[1]) for p in row)
        if abs(mass - 1.0) > Q_SUM_TOLERANCE:
            raise ValueError(f"draft q[{i}] sums to {mass!r}, not 1 (within {Q_SUM_TOLERANCE:g})")
        if out[i, tokens[i]] <= 0.0:
            raise ValueError(
                f"draft q[{i}] gives the draft token {tokens[i]} no mass: it cannot have been drawn from it"
            )
    return out
