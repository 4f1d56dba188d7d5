"""DecodeParams is validated in one place, and the oracle's processors do the contract's math (docs/contract.md,
"Decode state"), checked here on rows worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from _targets import small_target as small_hybrid
from specproof.contract import DecodeParams
from specproof.contract.decode_state import OracleProcessors, plain_decode_with, processor_state
from specproof.contract.errors import InvalidSettingError, TokenRangeError
from specproof.engine import greedy_decode


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": float("nan")}, "presence_penalty"),
        ({"frequency_penalty": True}, "frequency_penalty"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"logit_bias": {1: 1e9}}, "logit_bias[1]"),
        ({"bad_words": [[]]}, "bad_words"),
        ({"bad_words": "ab"}, "bad_words"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"eos_token_ids": [1.5]}, "eos_token_ids"),
        ({"stop": [[1, "x"]]}, "stop"),
    ],
)
def test_a_bad_parameter_is_an_error_naming_it(values: dict[str, object], names: str) -> None:
    with pytest.raises(InvalidSettingError, match=f"decode {names.replace('[', '.').replace(']', '.')}"):
        DecodeParams(**values)  # type: ignore[arg-type]


def test_parameters_are_keyword_only_and_round_trip_through_json() -> None:
    with pytest.raises(TypeError):
        DecodeParams(1.2)  # type: ignore[misc]
    params = DecodeParams(
        repetition_penalty=1.3, logit_bias={5: -2.0, 1: 3}, bad_words=[[2, 3]], min_tokens=2, eos_token_ids=[4, 4, 0]
    )
    assert params.logit_bias == ((1, 3.0), (5, -2.0)) and params.eos_token_ids == (0, 4)
    assert DecodeParams.from_json(params.to_json()) == params
    assert params.features() == {"penalties", "logit_bias", "bad_words", "min_tokens"}
    with pytest.raises(InvalidSettingError, match="unknown parameter 'temperature'"):
        DecodeParams.from_json({"temperature": 1.0})


def test_a_token_outside_the_vocabulary_names_its_field() -> None:
    with pytest.raises(TokenRangeError, match="decode stop holds token 9, outside"):
        DecodeParams(stop=[[1, 9]]).check_vocab(8)


def test_the_processors_in_the_contract_order() -> None:
    params = DecodeParams(
        repetition_penalty=2.0,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        logit_bias={3: 1.0},
        bad_words=[[1, 4], [5]],
        min_tokens=3,
        eos_token_ids=[6],
    )
    proc = OracleProcessors(params, prompt=[0], eos_token_id=7)
    for token in (1, 2, 2):
        proc.feed(token)
    row = np.array([4.0, -2.0, 6.0, 1.0, 3.0, 9.0, 8.0, 8.0])
    out = proc.apply(row)
    # 0: in the prompt, repetition only (4 / 2); 1: once out: -2 * 2 - (0.25 + 0.5); 2: twice: 6 / 2 - (0.5 + 0.5)
    assert out[0] == 2.0 and out[1] == -4.75 and out[2] == 2.0
    assert out[3] == 2.0 and out[4] == 3.0  # bias; bad word [1, 4] not armed (the output ends with 2)
    assert out[5] == -np.inf  # bad word [5] always
    assert out[6] == 8.0 and out[7] == 8.0  # min_tokens=3 with 3 out: no EOS id masked any more
    proc2 = OracleProcessors(params, prompt=[0], eos_token_id=7)
    proc2.feed(1)
    out2 = proc2.apply(row)
    assert out2[4] == -np.inf and out2[6] == -np.inf and out2[7] == -np.inf


def test_min_tokens_lets_eos_through_once_enough_are_out() -> None:
    proc = OracleProcessors(DecodeParams(min_tokens=2), prompt=[0], eos_token_id=3)
    row = np.zeros(4)
    proc.feed(1)
    assert proc.apply(row)[3] == -np.inf
    proc.feed(1)
    assert proc.apply(row)[3] == 0.0


def test_stops_name_their_reason() -> None:
    proc = OracleProcessors(DecodeParams(stop=[[2, 3]], eos_token_ids=[5]), prompt=[2])
    proc.feed(3)  # the prompt's 2 does not start a stop: stops match the output only
    assert proc.stopped() is None
    proc.feed(2)
    proc.feed(3)
    assert proc.stopped() == "stop_sequence"
    proc.feed(5)
    assert proc.stopped() == "eos"


def test_plain_decoding_without_parameters_is_plain_greedy_and_the_state_counts_the_output() -> None:
    prompt = [1, 2, 3, 1, 2]
    plain = plain_decode_with(small_hybrid(), prompt, 12, decode=DecodeParams())
    assert plain.tokens == greedy_decode(small_hybrid(), prompt, 12).tokens
    assert processor_state([3, 1, 3]) == {"generated": 3, "counts": {"1": 1, "3": 2}}


def test_plain_decoding_stops_on_a_stop_sequence() -> None:
    prompt = [1, 2, 3, 1, 2]
    free = plain_decode_with(small_hybrid(), prompt, 12, decode=DecodeParams()).tokens
    stopped = plain_decode_with(small_hybrid(), prompt, 12, decode=DecodeParams(stop=[free[3:5]]))
    first = next(i for i in range(1, 12) if tuple(free[i - 1 : i + 1]) == tuple(free[3:5]))
    assert stopped.tokens == free[: first + 1] and stopped.stop_reason == "stop_sequence"


def test_processors_that_mask_every_token_are_an_error() -> None:
    proc = OracleProcessors(DecodeParams(bad_words=[[0], [1]]), prompt=[0])
    with pytest.raises(InvalidSettingError, match="masked every token"):
        proc.apply(np.zeros(2))
