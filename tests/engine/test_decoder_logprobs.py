"""SpecDecoder's logprobs (docs/contract.md, "Decode state", "Logprobs"): each emitted token's logprob after the
processors, scored on the processed verify row of its position, equal to the oracle's teacher-forced scoring of
the output, one per token, cut with the tokens at the stop; None when the request did not ask."""

from __future__ import annotations

import numpy as np
import pytest

from _targets import small_target
from specproof.conformance.checks.decode_state import ScheduleDrafter
from specproof.contract import LOGPROB_TOLERANCE, DecodeParams, SamplingParams, TokenLogprob
from specproof.contract.decode_state import plain_decode_with, score_output
from specproof.contract.errors import InvalidSettingError, TokenRangeError
from specproof.engine import NgramDrafter, SpecDecoder

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
PARAMS = DecodeParams(repetition_penalty=1.5, frequency_penalty=0.4, logit_bias={7: 2.0}, bad_words=[[11]], logprobs=3)


def _decoder(rollback: str, source: list[int], schedule: list[tuple[int, int]]) -> SpecDecoder:
    decoder = SpecDecoder(small_target(), NgramDrafter(), k=4, rollback=rollback)  # type: ignore[arg-type]
    decoder.drafter = ScheduleDrafter(len(PROMPT), source, schedule, decoder.target.vocab_size)
    return decoder


def _close(got: tuple[TokenLogprob, ...], want: tuple[TokenLogprob, ...]) -> bool:
    return len(got) == len(want) and all(
        a.token == b.token
        and abs(a.logprob - b.logprob) <= LOGPROB_TOLERANCE
        and [t for t, _ in a.top] == [t for t, _ in b.top]
        and np.allclose([lp for _, lp in a.top], [lp for _, lp in b.top], atol=LOGPROB_TOLERANCE)
        for a, b in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize("schedule", [[(4, 4)], [(4, 0)], [(3, 1), (0, 0), (4, 2)]])
def test_logprobs_equal_the_teacher_forced_scoring_after_the_processors(
    rollback: str, schedule: list[tuple[int, int]]
) -> None:
    want = plain_decode_with(small_target(), PROMPT, 16, decode=PARAMS)
    gen = _decoder(rollback, list(want.tokens), schedule).generate(PROMPT, 16, decode=PARAMS)
    assert gen.tokens == want.tokens and gen.logprobs is not None
    assert _close(gen.logprobs, score_output(small_target(), PROMPT, gen.tokens, decode=PARAMS))
    assert all(len(lp.top) == 3 and lp.top[0][1] >= lp.logprob for lp in gen.logprobs)
    assert any(lp.logprob < -LOGPROB_TOLERANCE for lp in gen.logprobs)  # not a placeholder the check could miss


def test_the_scoring_is_after_the_processors() -> None:
    """The fixture's worth: the processors move these logprobs by more than the tolerance."""
    tokens = plain_decode_with(small_target(), PROMPT, 16, decode=PARAMS).tokens
    raw = score_output(small_target(), PROMPT, tokens, decode=DecodeParams(logprobs=0))
    processed = score_output(small_target(), PROMPT, tokens, decode=PARAMS)
    assert max(abs(a.logprob - b.logprob) for a, b in zip(raw, processed, strict=True)) > 100 * LOGPROB_TOLERANCE


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_logprobs_are_cut_with_the_tokens_at_a_stop_inside_an_accepted_block(rollback: str) -> None:
    free = list(plain_decode_with(small_target(), PROMPT, 16, decode=PARAMS).tokens)
    params = DecodeParams(**{**PARAMS.to_json(), "logit_bias": {7: 2.0}, "stop": [free[1:3]]})  # type: ignore[arg-type]
    want = plain_decode_with(small_target(), PROMPT, 16, decode=params)
    gen = _decoder(rollback, free, [(4, 4)]).generate(PROMPT, 16, decode=params)
    assert (gen.tokens, gen.stop_reason) == (want.tokens, "stop_sequence") and len(gen.tokens) == 3
    assert gen.logprobs is not None and [lp.token for lp in gen.logprobs] == list(gen.tokens)


def test_sampled_runs_score_the_same_processed_rows() -> None:
    sampling = SamplingParams(temperature=1.3, seed=5)
    gen = SpecDecoder(small_target(), NgramDrafter(), k=3).generate(PROMPT, 12, decode=PARAMS, sampling=sampling)
    assert gen.logprobs is not None
    assert _close(gen.logprobs, score_output(small_target(), PROMPT, gen.tokens, decode=PARAMS))


def test_no_logprobs_unless_asked() -> None:
    decoder = SpecDecoder(small_target(), NgramDrafter(), k=4)
    assert decoder.generate(PROMPT, 6, decode=DecodeParams(frequency_penalty=0.4)).logprobs is None
    assert decoder.generate(PROMPT, 6).logprobs is None
    assert decoder.generate(PROMPT, 6, decode=DecodeParams(logprobs=0)).logprobs[0].top == ()  # type: ignore[index]


@pytest.mark.parametrize("bad", [-1, 21, 1.5, True, "3"])
def test_a_bad_logprobs_count_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(InvalidSettingError, match="logprobs"):
        DecodeParams(logprobs=bad)  # type: ignore[arg-type]


def test_more_alternatives_than_the_vocabulary_is_refused_before_decoding() -> None:
    with pytest.raises(TokenRangeError, match="logprobs=20"):
        DecodeParams(logprobs=20).check_vocab(8)


def test_logprobs_round_trip_through_json() -> None:
    assert DecodeParams.from_json(PARAMS.to_json()) == PARAMS
    entry = TokenLogprob(token=3, logprob=-0.5, top=[(3, -0.5), (1, -1.0)])
    assert entry.to_json() == {"token": 3, "logprob": -0.5, "top": [[3, -0.5], [1, -1.0]]}
    with pytest.raises(ValueError, match="not <= 0"):
        TokenLogprob(token=3, logprob=0.5)
