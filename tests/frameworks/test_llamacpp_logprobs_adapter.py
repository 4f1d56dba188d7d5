"""The ``llamacpp:`` adapter's logprobs without llama.cpp: the recording stage's place in the sampler chain
(after the processors, before the pick), how it reads llama.cpp's ``llama_token_data_array``, and the
logprobs and top-n alternatives it makes of the rows (docs/real-engines.md, "Decode parameters").

tests/frameworks/test_llamacpp_decode.py certifies the real engine with them (``decode.logprobs``).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
import pytest

from specproof.contract import DecodeParams, SamplingParams
from specproof.engine.adapters._llamacpp_decode import LLAMACPP_DECODE_FEATURES, build_decode_chain
from specproof.engine.adapters._llamacpp_logprobs import LogprobRecorder, logprobs_of_rows


class _TokenData(ctypes.Structure):  # llama.cpp's llama_token_data
    _fields_ = [("id", ctypes.c_int32), ("logit", ctypes.c_float), ("p", ctypes.c_float)]


class _TokenDataArray(ctypes.Structure):  # llama.cpp's llama_token_data_array
    _fields_ = [("data", ctypes.POINTER(_TokenData)), ("size", ctypes.c_size_t), ("selected", ctypes.c_int64),
                ("sorted", ctypes.c_bool)]  # fmt: skip


class _Chain:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append(name)


class _Internals:
    LlamaSampler = _Chain


def _chain(decode: DecodeParams, sampling: SamplingParams | None = None) -> list[str]:
    recorder = LogprobRecorder(16, _TokenData)
    chain = build_decode_chain(
        _Internals, n_vocab=16, window=64, decode=decode, prompt=[1], sampling=sampling, seed=3, recorder=recorder
    )
    return chain.calls  # type: ignore[no-any-return]


def test_the_recording_stage_sees_the_processed_row_before_the_pick() -> None:
    decode = DecodeParams(repetition_penalty=1.5, frequency_penalty=0.5, logit_bias={2: 1.0}, logprobs=2)
    assert _chain(decode) == ["add_penalties", "accept", "add_penalties", "add_logit_bias", "add_custom",
                              "add_greedy"]  # fmt: skip
    # the contract's logprobs are before the temperature and the truncation: the stage precedes them
    sampled = _chain(DecodeParams(logprobs=0), SamplingParams(temperature=0.5, top_k=3, seed=1))
    assert sampled == ["add_custom", "add_temp", "add_top_k", "add_top_p", "add_min_p", "add_dist"]
    assert {"logprobs", "top_logprobs"} <= set(LLAMACPP_DECODE_FEATURES)
    assert "grammar" in LLAMACPP_DECODE_FEATURES  # llama.cpp's grammar sampler on a GBNF translation


def test_the_grammar_masks_after_the_bias_and_before_the_recording_stage() -> None:
    """The contract's order: the grammar is the last processor, and the logprobs are read after it."""
    decode = DecodeParams(presence_penalty=0.5, logit_bias={2: 1.0}, logprobs=0)
    chain = build_decode_chain(
        _Internals, n_vocab=16, window=64, decode=decode, prompt=[1], sampling=None, seed=3,
        recorder=LogprobRecorder(16, _TokenData), grammar=lambda chain: chain.calls.append("grammar"),
    )  # fmt: skip
    assert chain.calls == ["add_penalties", "add_logit_bias", "grammar", "add_custom", "add_greedy"]


def test_the_recorder_reads_llama_cpps_token_array_by_id() -> None:
    entries = [(3, 0.5), (0, -1.0), (2, 2.0)]  # llama.cpp's order need not be the ids'
    data = (_TokenData * 3)(*[_TokenData(i, v, 0.0) for i, v in entries])
    array = _TokenDataArray(ctypes.cast(data, ctypes.POINTER(_TokenData)), 3, -1, False)
    recorder = LogprobRecorder(5, _TokenData)
    recorder(ctypes.pointer(array))
    [row] = recorder.rows
    assert row.tolist() == [-1.0, -math.inf, 2.0, 0.5, -math.inf]


def test_logprobs_and_alternatives_from_the_rows() -> None:
    rows = [np.array([0.0, 1.0, 1.0, -np.inf]), np.array([2.0, 0.0, 0.0, 0.0]), np.array([9.0, 9.0, 9.0, 9.0])]
    got = logprobs_of_rows(rows, [2, 0], top_n=3)  # the third row was sampled past the stop: dropped
    assert len(got) == 2
    z = math.log(1 + 2 * math.e)
    assert got[0].token == 2 and got[0].logprob == pytest.approx(1 - z)
    # most likely first, the lower id first on a tie; a token the processors made impossible is no alternative
    assert [t for t, _ in got[0].top] == [1, 2, 0]
    assert [t for t, _ in logprobs_of_rows(rows[:1], [2], top_n=4)[0].top] == [1, 2, 0]
    assert logprobs_of_rows(rows[1:2], [0], top_n=0)[0].top == ()
    with pytest.raises(AssertionError, match="1 rows for 2 emitted tokens"):
        logprobs_of_rows(rows[:1], [2, 0], top_n=0)
