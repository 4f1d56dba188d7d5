"""The ``vllm:`` and ``llamacpp:`` adapters' decode parameters without either engine: each ``DecodeParams``
field mapped onto the engine's own, in the contract's order, and what an engine cannot honour refused with
``UnsupportedParameterError`` naming it (docs/real-engines.md, "Decode parameters").

These run anywhere (numpy only); tests/frameworks/test_vllm_decode.py and test_llamacpp_decode.py certify
the real engines with them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specproof.contract import DecodeParams, Grammar, SamplingParams
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.engine.adapters._decode_option import refuse_unmapped
from specproof.engine.adapters._llamacpp_decode import (
    LLAMACPP_DECODE_FEATURES,
    build_decode_chain,
    check_llamacpp_decode,
    stop_reason_after,
)
from specproof.engine.adapters._vllm_decode import (
    LOGPROBS_MODE,
    VLLM_DECODE_FEATURES,
    decode_stop_reason,
    token_logprobs,
    vllm_decode,
)
from specproof.engine.adapters.vllm import parse_vllm_spec
from specproof.engine.targets.convert import save_vllm_lfm2
from specproof.fixtures import load_trained_target

# ------------------------------------------------------------------ vLLM


def test_vllm_every_processor_maps_onto_sampling_params() -> None:
    decode = DecodeParams(
        presence_penalty=0.5, frequency_penalty=1.5, logit_bias={7: 3.0, 2: -100.0},
        bad_words=[[4, 5], [9]], min_tokens=30, eos_token_ids=[11], stop=[[12], [11]],
    )  # fmt: skip
    mapped = vllm_decode(decode, eos_token_id=3, max_tokens=20)
    assert mapped.kwargs == {
        "repetition_penalty": 1.0,
        "presence_penalty": 0.5,
        "frequency_penalty": 1.5,
        "logit_bias": {2: -100.0, 7: 3.0},
        "min_tokens": 20,  # vLLM refuses min_tokens > max_tokens; past it the mask changes nothing
        "stop_token_ids": [3, 11, 12],
    }
    assert mapped.bad_words_token_ids == [[4, 5], [9]]
    assert mapped.eos_ids == {3, 11} and mapped.stop_ids == {12}  # a stop that is an EOS id ends as eos


def test_vllm_without_decode_every_processor_is_off() -> None:
    mapped = vllm_decode(None, eos_token_id=None, max_tokens=8)
    assert mapped.kwargs["repetition_penalty"] == 1.0 and mapped.kwargs["logit_bias"] is None
    assert mapped.kwargs["stop_token_ids"] is None and mapped.kwargs["min_tokens"] == 0
    assert mapped.bad_words_token_ids == []


def test_vllm_refuses_what_it_cannot_honour_naming_it() -> None:
    with pytest.raises(UnsupportedParameterError, match=r"stop \[4, 5\] is a sequence of 2 tokens"):
        vllm_decode(DecodeParams(stop=[[3], [4, 5]]), eos_token_id=None, max_tokens=8)
    with pytest.raises(UnsupportedParameterError, match="logit_bias with repetition_penalty=2"):
        vllm_decode(DecodeParams(repetition_penalty=2.0, logit_bias={1: 2.0}), eos_token_id=None, max_tokens=8)
    # each alone is honoured
    vllm_decode(DecodeParams(repetition_penalty=2.0), eos_token_id=None, max_tokens=8)
    vllm_decode(DecodeParams(logit_bias={1: 2.0}, presence_penalty=1.0), eos_token_id=None, max_tokens=8)
    with pytest.raises(InvalidSettingError, match="must be DecodeParams"):
        vllm_decode({"min_tokens": 2}, eos_token_id=None, max_tokens=8)  # type: ignore[arg-type]
    assert issubclass(UnsupportedParameterError, InvalidSettingError)


def test_vllm_logprobs_are_asked_after_the_processors_on_greedy_requests_only() -> None:
    mapped = vllm_decode(DecodeParams(logprobs=3, presence_penalty=1.0), eos_token_id=None, max_tokens=8)
    assert mapped.kwargs["logprobs"] == 3 and mapped.logprobs == 3
    assert "logprobs" not in vllm_decode(DecodeParams(), eos_token_id=None, max_tokens=8).kwargs
    assert LOGPROBS_MODE == "processed_logprobs"  # vLLM's default, raw_logprobs, is before every processor
    with pytest.raises(UnsupportedParameterError, match=r"logprobs on a sampled request.*after the temperature"):
        vllm_decode(DecodeParams(logprobs=0), eos_token_id=None, max_tokens=8, sampled=True)
    assert {"logprobs", "top_logprobs"} <= set(VLLM_DECODE_FEATURES) and "grammar" not in VLLM_DECODE_FEATURES


class _Logprob:
    def __init__(self, logprob: float, rank: int) -> None:
        self.logprob, self.rank = logprob, rank


def test_vllm_logprobs_become_the_contracts_records() -> None:
    # vLLM's per position: the sampled token's (any rank) beside the top-n by rank
    positions = [
        {5: _Logprob(-0.1, 1), 2: _Logprob(-2.5, 2)},
        {7: _Logprob(-3.0, 4), 1: _Logprob(-0.2, 1), 0: _Logprob(-float("inf"), 2)},
    ]
    got = token_logprobs([5, 7], positions, top_n=2)
    assert [(g.token, g.logprob) for g in got] == [(5, -0.1), (7, -3.0)]
    assert got[0].top == ((5, -0.1), (2, -2.5))
    assert got[1].top == ((1, -0.2),)  # a masked token (-inf) is no alternative; the sampled one past the top-n
    assert token_logprobs([5], positions[:1], top_n=0)[0].top == ()
    with pytest.raises(UnsupportedParameterError, match="returned None logprobs for 1 tokens"):
        token_logprobs([5], None, top_n=0)


def test_vllm_stop_reason_comes_from_the_last_token_never_a_cut() -> None:
    mapped = vllm_decode(DecodeParams(eos_token_ids=[5], stop=[[6]]), eos_token_id=None, max_tokens=8)
    assert decode_stop_reason([1, 5], mapped, asked=8, allowed=8) == "eos"
    assert decode_stop_reason([1, 6], mapped, asked=8, allowed=8) == "stop_sequence"
    assert decode_stop_reason([5, 1], mapped, asked=8, allowed=8) == "max_new_tokens"  # a token past it: vLLM's
    assert decode_stop_reason([1, 2], mapped, asked=8, allowed=2) == "context_full"


def test_vllm_decode_option_narrows_what_the_engine_declares(tmp_path: Path) -> None:
    checkpoint = save_vllm_lfm2(load_trained_target(), str(tmp_path / "trained"), source="trained")
    assert parse_vllm_spec(str(checkpoint)).decode_features == VLLM_DECODE_FEATURES
    settings = parse_vllm_spec(f"{checkpoint},decode=min_tokens+logit_bias")
    assert settings.decode_features == ("logit_bias", "min_tokens")
    assert settings.short_name() == "vllm-greedy-decode-logit_bias+min_tokens"
    with pytest.raises(InvalidSettingError, match="'grammar' is not a decode feature"):
        parse_vllm_spec(f"{checkpoint},decode=penalties+grammar")


# ------------------------------------------------------------------ llama.cpp


class _Chain:
    """Records what the adapter asks of llama-cpp-python's ``LlamaSampler``, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, *args, *sorted(kwargs.items())))


class _Internals:
    LlamaSampler = _Chain


def _chain(decode: DecodeParams, sampling: SamplingParams | None = None) -> list[tuple[Any, ...]]:
    chain = build_decode_chain(
        _Internals, n_vocab=16, window=512, decode=decode, prompt=[3, 4], sampling=sampling, seed=9
    )
    return chain.calls  # type: ignore[no-any-return]


def test_llamacpp_chain_is_llama_cpps_samplers_in_the_contracts_order() -> None:
    decode = DecodeParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=1.5, logit_bias={7: 3.0})
    rep = ("add_penalties", ("n_vocab", 16), ("penalty_freq", 0.0), ("penalty_last_n", 512),
           ("penalty_present", 0.0), ("penalty_repeat", 2.0))  # fmt: skip
    freq = ("add_penalties", ("n_vocab", 16), ("penalty_freq", 1.5), ("penalty_last_n", 512),
            ("penalty_present", 0.5), ("penalty_repeat", 1.0))  # fmt: skip
    # the repetition penalty is fed the prompt before the output penalties join the chain: only it counts it
    assert _chain(decode) == [rep, ("accept", 3), ("accept", 4), freq, ("add_logit_bias", 16, {7: 3.0}),
                              ("add_greedy",)]  # fmt: skip
    assert _chain(DecodeParams()) == [("add_greedy",)]


def test_llamacpp_sampled_chain_divides_by_the_temperature_first() -> None:
    sampling = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, seed=1)
    assert _chain(DecodeParams(logit_bias={1: 1.0}), sampling) == [
        ("add_logit_bias", 16, {1: 1.0}), ("add_temp", 0.7), ("add_top_k", 5), ("add_top_p", 0.9, 1),
        ("add_min_p", 0.1, 1), ("add_dist", 9),
    ]  # fmt: skip


def test_llamacpp_refuses_what_it_cannot_honour_naming_it() -> None:
    assert set(LLAMACPP_DECODE_FEATURES) == {
        "penalties", "logit_bias", "stop_sequences", "logprobs", "top_logprobs", "grammar",
    }  # fmt: skip
    with pytest.raises(UnsupportedParameterError, match="min_tokens=3"):
        check_llamacpp_decode(DecodeParams(min_tokens=3))
    with pytest.raises(UnsupportedParameterError, match=r"bad_words \[\[1, 2\]\]"):
        check_llamacpp_decode(DecodeParams(bad_words=[[1, 2]]))
    grammar = DecodeParams(grammar=Grammar(kind="regex", source="[0-9]+"), eos_token_ids=[0])
    assert check_llamacpp_decode(grammar) is grammar  # translated to GBNF by the engine (_llamacpp_grammar)
    with pytest.raises(InvalidSettingError, match="must be DecodeParams"):
        check_llamacpp_decode({"stop": [[1]]})
    ok = DecodeParams(repetition_penalty=1.3, logit_bias={1: -4.0}, stop=[[1, 2]], eos_token_ids=[5])
    assert check_llamacpp_decode(ok) is ok


def test_llamacpp_stops_where_the_contract_says() -> None:
    decode = DecodeParams(stop=[[1, 2], [5]], eos_token_ids=[5])
    eos = decode.eos_set(9)
    assert stop_reason_after([], decode, eos) is None
    assert stop_reason_after([0, 1], decode, eos) is None
    assert stop_reason_after([0, 1, 2], decode, eos) == "stop_sequence"
    assert stop_reason_after([0, 5], decode, eos) == "eos"  # an EOS id that is also a stop ends as eos
    assert stop_reason_after([9], decode, eos) == "eos"


def test_a_field_an_adapter_does_not_map_is_refused_naming_it() -> None:
    """A field added to DecodeParams later (a grammar, logprobs) is refused by an adapter that does not pass
    it through, never dropped: the adapters list what they map, not what they refuse."""
    everything = {"repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "bad_words",
                  "eos_token_ids", "stop"}  # fmt: skip
    refuse_unmapped(DecodeParams(min_tokens=0), mapped=everything, where="x")  # at its default: not asked
    with pytest.raises(UnsupportedParameterError, match="x: min_tokens=2 is not passed to the engine"):
        refuse_unmapped(DecodeParams(min_tokens=2), mapped=everything, where="x")
