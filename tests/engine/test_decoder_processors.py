"""SpecDecoder with DecodeParams equals plain decoding with the same processors and stops (docs/contract.md,
"Decode state"): each verify row processed with the state advanced through the draft before it, only the
emitted tokens committed, the output cut where plain decoding stops."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _targets import small_target
from specproof.conformance.checks.decode_state import ScheduleDrafter
from specproof.contract import DecodeParams, SamplingParams
from specproof.contract.decode_state import OracleProcessors, plain_decode_with, processor_state
from specproof.contract.errors import InvalidSettingError, TokenRangeError
from specproof.engine import NgramDrafter, RequestProcessors, SpecDecoder
from specproof.strategies import draft_schedules, processor_configs, stop_sets

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
PENALTIES = DecodeParams(repetition_penalty=1.5, frequency_penalty=0.4, logit_bias={7: 2.0}, bad_words=[[11]])
ALL = frozenset({"penalties", "logit_bias", "bad_words"})


def _decoder(rollback: str, source: list[int], schedule: list[tuple[int, int]], k: int = 4) -> SpecDecoder:
    decoder = SpecDecoder(small_target(), NgramDrafter(), k=k, rollback=rollback)  # type: ignore[arg-type]
    decoder.drafter = ScheduleDrafter(len(PROMPT), source, schedule, decoder.target.vocab_size)
    return decoder


def _free(n: int = 16, params: DecodeParams = PENALTIES) -> list[int]:
    return list(plain_decode_with(small_target(), PROMPT, n, decode=params).tokens)


def test_the_penalties_change_plain_decoding_here() -> None:
    """The fixture's worth: without it every test below could pass on an engine that ignores the penalties."""
    assert _free(params=DecodeParams()) != _free()


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize(
    ("where", "stop", "eos"),
    [
        ("inside an accepted block", slice(1, 3), None),
        ("straddling two rounds", slice(4, 6), None),
        ("overlapping an EOS", slice(6, 8), 7),
    ],
)
def test_a_stop_cuts_the_output_where_plain_decoding_stops(
    rollback: str, where: str, stop: slice, eos: int | None
) -> None:
    free = _free()
    params = DecodeParams(
        repetition_penalty=1.5, frequency_penalty=0.4, logit_bias={7: 2.0}, bad_words=[[11]], stop=[free[stop]]
    )
    eos_id = None if eos is None else free[eos]
    want = plain_decode_with(small_target(), PROMPT, 16, decode=params, eos_token_id=eos_id)
    assert want.stop_reason in ("eos", "stop_sequence"), where
    decoder = _decoder(rollback, free, [(4, 4)])  # full blocks of 5 tokens a round
    got = decoder.generate(PROMPT, 16, eos_token_id=eos_id, decode=params)
    assert (got.tokens, got.stop_reason) == (want.tokens, want.stop_reason), where
    assert decoder.processor_states[-1] == processor_state(want.tokens)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_each_round_commits_only_what_it_emitted(rollback: str) -> None:
    free = _free()
    decoder = _decoder(rollback, free, [(4, 4), (4, 1), (0, 0), (3, 0), (2, 2)])
    got = decoder.generate(PROMPT, 16, decode=PENALTIES)
    assert got.tokens == tuple(free)
    assert got.steps is not None and len(decoder.processor_states) == len(got.steps)
    out = 0
    for step, state in zip(got.steps, decoder.processor_states, strict=True):
        out += len(step.accepted)
        assert state == processor_state(free[:out])


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_schedule_processors_and_stops_give_plain_decodings_output(data: st.DataObject) -> None:
    vocab = small_target().vocab_size
    base = data.draw(processor_configs(vocab, features=ALL))
    free = _free(14, base)
    params, eos = data.draw(stop_sets(base, free, kind=data.draw(st.sampled_from(["min_tokens", "stops"]))))
    want = plain_decode_with(small_target(), PROMPT, 14, decode=params, eos_token_id=eos)
    schedule = data.draw(draft_schedules(k=3))
    rollback = data.draw(st.sampled_from(["checkpoint", "replay"]))
    source = free if tuple(free[: len(want.tokens)]) == want.tokens else list(want.tokens)
    got = _decoder(rollback, source, schedule, k=3).generate(PROMPT, 14, eos_token_id=eos, decode=params)
    assert (got.tokens, got.stop_reason) == (want.tokens, want.stop_reason)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_the_engines_copy_of_the_processor_math_agrees_with_the_contracts(data: st.DataObject) -> None:
    vocab = 12
    params = data.draw(processor_configs(vocab, features=ALL))
    params = attrs.evolve(params, min_tokens=data.draw(st.integers(0, 4)), eos_token_ids=[0])
    prompt = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=5))
    output = data.draw(st.lists(st.integers(0, vocab - 1), max_size=6))
    row = np.array(data.draw(st.lists(st.floats(-8, 8), min_size=vocab, max_size=vocab)))
    oracle = OracleProcessors(params, prompt)
    engine = RequestProcessors(params, prompt, params.eos_set(None), vocab)
    for token in output:
        oracle.feed(token)
    engine.commit(output, draft=())
    try:
        want = oracle.apply(row)
    except InvalidSettingError:
        return  # every token masked: the oracle refuses the row
    np.testing.assert_array_equal(engine.process(row, ()), want)


def test_bad_decode_input_is_refused_before_any_forward() -> None:
    decoder = SpecDecoder(small_target(), NgramDrafter(), k=2)
    with pytest.raises(InvalidSettingError, match="must be a DecodeParams"):
        decoder.generate(PROMPT, 4, decode={"min_tokens": 1})  # type: ignore[arg-type]
    with pytest.raises(TokenRangeError, match="decode logit_bias holds token 999"):
        decoder.generate(PROMPT, 4, decode=DecodeParams(logit_bias={999: 1.0}))


def test_sampling_at_top_k_1_with_processors_is_plain_decoding_with_them() -> None:
    free = _free()
    decoder = _decoder("checkpoint", free, [(4, 4), (4, 2)])
    got = decoder.generate(PROMPT, 16, decode=PENALTIES, sampling=SamplingParams(temperature=0.7, top_k=1, seed=3))
    assert got.tokens == tuple(free)
