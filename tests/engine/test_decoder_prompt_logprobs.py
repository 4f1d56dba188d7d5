"""Prompt logprobs (docs/contract.md, "Decode state", "Prompt logprobs"): ``DecodeParams(prompt_logprobs=n)`` gives
each prompt token's logprob after the ones before it, before any processor, equal to the teacher-forced scoring
of the prompt; the option is validated in one place and refused where the engine cannot answer it."""

from __future__ import annotations

import numpy as np
import pytest

from _targets import small_target
from specproof.contract import DecodeParams
from specproof.contract.decode_state import prompt_rows
from specproof.contract.errors import InvalidSettingError, TokenRangeError, UnsupportedParameterError
from specproof.engine import NgramDrafter, SpecDecoder
from specproof.wire._decode_ask import check_decode

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_prompt_logprobs_equal_the_prompts_teacher_forced_scoring(rollback: str) -> None:
    params = DecodeParams(prompt_logprobs=2, repetition_penalty=3.0, logit_bias={1: 50.0})  # processors: output only
    gen = SpecDecoder(small_target(), NgramDrafter(), k=4, rollback=rollback).generate(PROMPT, 6, decode=params)
    rows = prompt_rows(small_target(), PROMPT)
    assert gen.prompt_logprobs is not None and [lp.token for lp in gen.prompt_logprobs] == PROMPT[1:]
    got = np.array([lp.logprob for lp in gen.prompt_logprobs])
    np.testing.assert_allclose(got, [rows[i, t] for i, t in enumerate(PROMPT[1:])], atol=1e-9)
    assert all(
        len(lp.top) == 2 and lp.top[0][1] == pytest.approx(rows[i].max()) for i, lp in enumerate(gen.prompt_logprobs)
    )
    plain = SpecDecoder(small_target(), NgramDrafter(), k=4).generate(
        PROMPT, 6, decode=DecodeParams(logit_bias={1: 50.0}, repetition_penalty=3.0)
    )
    assert gen.tokens == plain.tokens  # asking changes nothing else


def test_not_asked_is_none_and_a_one_token_prompt_has_none_to_score() -> None:
    decoder = SpecDecoder(small_target(), NgramDrafter(), k=4)
    assert decoder.generate(PROMPT, 4, decode=DecodeParams()).prompt_logprobs is None
    assert decoder.generate([7], 4, decode=DecodeParams(prompt_logprobs=0)).prompt_logprobs == ()


def test_a_later_call_of_a_session_refuses_prompt_logprobs_naming_why() -> None:
    session = SpecDecoder(small_target(), NgramDrafter(), k=4).start(PROMPT)
    session.generate(3)
    with pytest.raises(UnsupportedParameterError, match="first generate call"):
        session.generate(3, decode=DecodeParams(prompt_logprobs=0))


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2", 10_000])
def test_a_bad_prompt_logprobs_is_refused_naming_the_option(bad: object) -> None:
    with pytest.raises(InvalidSettingError, match="prompt_logprobs"):
        DecodeParams(prompt_logprobs=bad)  # type: ignore[arg-type]


def test_more_alternatives_than_ids_is_refused_before_decoding() -> None:
    with pytest.raises(TokenRangeError, match="prompt_logprobs=20"):
        DecodeParams(prompt_logprobs=20).check_vocab(16)


def test_prompt_logprobs_round_trip_through_json_and_are_absent_when_off() -> None:
    params = DecodeParams(prompt_logprobs=3)
    assert params.to_json()["prompt_logprobs"] == 3 and DecodeParams.from_json(params.to_json()) == params
    assert "prompt_logprobs" not in DecodeParams().to_json()
    assert params.features() == {"prompt_logprobs", "top_logprobs"}


def test_the_wire_refuses_prompt_logprobs_before_sending() -> None:
    """``specproof-engine/1`` does not carry them: a request is refused whatever the engine declares."""
    with pytest.raises(InvalidSettingError, match="prompt_logprobs"):
        check_decode(DecodeParams(prompt_logprobs=0), frozenset({"logprobs", "prompt_logprobs"}), "exec:x")
