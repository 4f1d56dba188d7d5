"""SpecDecoder with a grammar equals plain decoding with it (docs/contract.md, "Decode state"): each verify
row masked with the matcher advanced through the draft before it, the matcher rolled back to the emitted
tokens, a terminated matcher never advanced nor asked for a mask, and a reasoning delimiter honoured wherever
in a draft block it ends."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproof.conformance.checks.decode_grammar import GrammarDrafter, grammars
from specproof.conformance.zoo._grammar_engines import GrammarOffWhenDelimiterInBlock, ScratchMatcherEngine
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import DecodeParams, Generation, Grammar, SamplingParams
from specproof.contract.decode_state import first_invalid_token, grammar_state, plain_decode_with
from specproof.engine import EngineGrammar, NgramDrafter, RequestProcessors, SpecDecoder

EOS = 63
PROMPT = (5, 9, 20, 30)
FULL_BLOCKS = [(4, 4)]  # every round drafts 4 right tokens: round r emits output positions 5r .. 5r+4


def _run(engine: SpecDecoder, params: DecodeParams, schedule: list[tuple[int, int]], n: int = 20) -> Generation:
    expected = plain_decode_with(small_reference(), PROMPT, n, decode=params)
    free = plain_decode_with(small_reference(), PROMPT, n, decode=DecodeParams(eos_token_ids=[EOS]))
    source = [*expected.tokens, *free.tokens]  # drafts run on past the end (forbidden tokens, a complete grammar)
    alternatives = [None] * len(source)
    engine.drafter = GrammarDrafter(len(PROMPT), source, schedule, 64, alternatives)
    return engine.generate(list(PROMPT), n, decode=params)


def _judge(engine: SpecDecoder, params: DecodeParams, gen: Generation) -> None:
    grammar = params.grammar
    assert grammar is not None
    expected = plain_decode_with(small_reference(), PROMPT, 20, decode=params)
    assert (gen.tokens, gen.stop_reason) == (expected.tokens, expected.stop_reason)
    assert first_invalid_token(grammar, frozenset({EOS}), 64, gen.tokens) is None
    for state in engine.processor_states:
        assert state["grammar"] == grammar_state(grammar, frozenset({EOS}), 64, gen.tokens[: state["generated"]])


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize("grammar", grammars(), ids=lambda g: g.kind)
@pytest.mark.parametrize("schedule", [FULL_BLOCKS, [(4, 1), (3, 0), (4, 2), (0, 0)], [(2, 2), (4, 3)]])
def test_the_decoder_equals_plain_decoding_with_the_grammar(
    grammar: Grammar, rollback: str, schedule: list[tuple[int, int]]
) -> None:
    params = DecodeParams(grammar=grammar, eos_token_ids=[EOS], repetition_penalty=1.3)
    engine = SpecDecoder(small_reference(), NgramDrafter(), k=4, rollback=rollback)  # type: ignore[arg-type]
    _judge(engine, params, _run(engine, params, schedule))


class _SpyMatcher:
    """The llguidance matcher, recording any advance or mask asked of it once it is terminated (stopped)."""

    def __init__(self, matcher: Any, log: list[str]) -> None:
        self._matcher, self._log = matcher, log

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._matcher, name)
        if name in ("consume_token", "consume_tokens", "try_consume_tokens", "compute_bitmask"):
            if self._matcher.is_stopped():
                self._log.append(name)
        return attr


def test_a_terminated_matcher_is_never_advanced_nor_asked_for_a_mask() -> None:
    log: list[str] = []

    class Spied(EngineGrammar):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.matcher = _SpyMatcher(self.matcher, log)

    class Processors(RequestProcessors):
        grammar_class = Spied

    engine = SpecDecoder(small_reference(), NgramDrafter(), k=4)
    engine.processors_class = Processors
    params = DecodeParams(grammar=grammars()[0], eos_token_ids=[EOS])
    gen = _run(engine, params, FULL_BLOCKS)
    assert gen.stop_reason == "eos" and any(s["grammar"]["stopped"] for s in engine.processor_states)
    assert log == []


def _delimited(offset: int) -> tuple[DecodeParams, int]:
    """A regex grammar after a delimiter that first ends at output position ``5 + offset`` (round 1's block)."""
    free = plain_decode_with(small_reference(), PROMPT, 20, decode=DecodeParams(eos_token_ids=[EOS])).tokens
    end = 5 + offset
    for length in (1, 2, 3):
        delimiter = tuple(free[end + 1 - length : end + 1])
        first = next(i for i in range(len(free)) if tuple(free[i + 1 - length : i + 1]) == delimiter)
        if first == end:
            grammar = Grammar(kind="regex", source="[0-9]{1,3}(,[0-9]{1,3}){0,2}", reasoning_end=delimiter)
            return DecodeParams(grammar=grammar, eos_token_ids=[EOS]), end
    raise AssertionError(f"no delimiter of 1-3 tokens first ends at {end} in {free}")


@pytest.mark.parametrize("offset", range(5))
def test_the_delimiter_at_every_offset_of_a_draft_block(offset: int) -> None:
    """Offsets 0-3 end the delimiter on a draft token, later rows constrained; 4 on the target's own token."""
    params, _ = _delimited(offset)
    for engine in (SpecDecoder(small_reference(), NgramDrafter(), k=4), ScratchMatcherEngine()):
        _judge(engine, params, _run(engine, params, FULL_BLOCKS))
    broken = GrammarOffWhenDelimiterInBlock()
    expected = plain_decode_with(small_reference(), PROMPT, 20, decode=params)
    try:
        wrong = _run(broken, params, FULL_BLOCKS).tokens != expected.tokens
    except Exception:  # the grammar refusing a token emitted unconstrained is a rejection too
        wrong = True
    assert wrong == (offset < 4)


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_any_delimiter_place_and_schedule_equal_plain_decoding(data: st.DataObject) -> None:
    params, _ = _delimited(data.draw(st.integers(0, 4), label="offset"))
    rounds = st.integers(0, 4).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n)))
    schedule = data.draw(st.lists(rounds, min_size=1, max_size=8), label="schedule")
    rollback = data.draw(st.sampled_from(["checkpoint", "replay"]), label="rollback")
    engine = SpecDecoder(small_reference(), NgramDrafter(), k=4, rollback=rollback)  # type: ignore[arg-type]
    _judge(engine, params, _run(engine, params, schedule))


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["rejection", "match"])
def test_sampled_generations_with_a_grammar_emit_only_valid_prefixes(scheme: str) -> None:
    """The sampled rules see the masked rows: a forbidden token has p = 0, so it is never accepted nor drawn."""
    engine = SpecDecoder(small_reference(), NgramDrafter(), k=4, scheme=scheme)  # type: ignore[arg-type]
    for grammar in grammars():
        params = DecodeParams(grammar=grammar, eos_token_ids=[EOS])
        for seed in range(3):
            gen = engine.generate(list(PROMPT), 20, decode=params, sampling=SamplingParams(temperature=1.5, seed=seed))
            assert first_invalid_token(grammar, frozenset({EOS}), 64, gen.tokens) is None, gen.tokens
