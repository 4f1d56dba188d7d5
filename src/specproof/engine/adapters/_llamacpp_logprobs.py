"""The ``llamacpp:`` engine's logprobs: each emitted token's logprob after llama.cpp's own processors
(docs/contract.md, "Decode state", "Logprobs"; docs/real-engines.md, "Decode parameters").

llama-cpp-python returns no logprobs from ``Llama.generate``, and ``Llama.scores`` holds the model's raw logits
(before penalties and bias). So the adapter puts a recording stage into llama.cpp's sampler chain
(``LlamaSampler.add_custom``) after the penalties and the logit bias, before the temperature and the pick: it
sees the row llama.cpp's processors made, exactly as the pick sees it, and changes nothing. ``Llama.generate``
samples once per token it yields (a verified draft row is sampled and the draft token kept only when it equals
the sample), so the i-th recorded row is the i-th emitted token's: rows sampled past the adapter's stop are
dropped with the tokens. The logprob is the log-softmax of that row (float64, from llama.cpp's float32).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from specproof.contract import TokenLogprob

__all__ = ["LogprobRecorder", "logprobs_of_rows"]

#: llama.cpp's ``llama_token_data`` (id, logit, p), as llama-cpp-python reads it in its own custom sampler
_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


class LogprobRecorder:
    """A sampler-chain stage (``chain.add_custom(recorder)``) keeping every row it is applied to, by token id
    (``n_vocab`` wide: an id the row does not hold is -inf)."""

    def __init__(self, n_vocab: int, token_data: Any) -> None:
        self.n_vocab = int(n_vocab)
        self._token_data = token_data  # llama_cpp.llama_token_data (the ctypes struct)
        self.rows: list[np.ndarray] = []

    def __call__(self, cur_p: Any) -> None:
        size = int(cur_p.contents.size)
        address = ctypes.addressof(cur_p.contents.data.contents)
        data = np.frombuffer((self._token_data * size).from_address(address), dtype=_TOKEN_DATA, count=size)
        row = np.full(self.n_vocab, -np.inf)
        row[data["id"]] = data["logit"]
        self.rows.append(row)


def _log_softmax(row: np.ndarray) -> np.ndarray:
    top = np.max(row)
    shifted = row - top
    return shifted - np.log(np.sum(np.exp(shifted)))


def logprobs_of_rows(rows: Sequence[np.ndarray], tokens: Sequence[int], *, top_n: int) -> tuple[TokenLogprob, ...]:
    """One ``TokenLogprob`` per token of ``tokens`` from its processed row (``rows[i]``: the row token ``i`` was
    picked from), with its ``top_n`` most likely alternatives (most likely first, the lower id on a tie; only
    tokens the processors left possible)."""
    if len(rows) < len(tokens):
        raise AssertionError(f"llama.cpp sampled {len(rows)} rows for {len(tokens)} emitted tokens")
    out = []
    for row, token in zip(rows, tokens, strict=False):
        lp = _log_softmax(row)
        top: list[tuple[int, float]] = []
        if top_n:
            finite = np.flatnonzero(np.isfinite(lp))
            order = finite[np.lexsort((finite, -lp[finite]))][:top_n]
            top = [(int(t), float(lp[t])) for t in order]
        out.append(TokenLogprob(token=int(token), logprob=min(0.0, float(lp[int(token)])), top=top))
    return tuple(out)
