"""decode.grammar-sampled (docs/contract.md, "Decode state", "Sampled runs"): its drafter drafts what the grammar
allows after any sampled output (and, in some rounds, one token it forbids); the check rejects an engine that
samples a replacement from the unmasked row (on the emitted prefix, also when the engine does not guard its own
matcher), a matcher never rolled back, and accepts the correct engine with a grammar and a reasoning delimiter,
exercised; the sampled-only members pass the greedy grammar check."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from specproof.conformance._registry import get
from specproof.conformance.checks.decode_grammar import GrammarRun, check_grammar, grammars, run_grammar_example
from specproof.conformance.checks.decode_grammar_sampled import GENERATIONS, GrammarWalkDrafter, check_grammar_sampled
from specproof.conformance.checks.decode_sampled import SAMPLINGS, SampledDecodeExample
from specproof.conformance.checks.decode_state import DecodeExample, DecodeSubject
from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.conformance.zoo._grammar_engines import GrammarNotRolledBack
from specproof.conformance.zoo._grammar_sampled_engines import (
    GrammarFollowsArgmaxWhenSampling,
    GrammarUnmaskedResidualWhenSampling,
    _UnmaskedResidual,
)
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import DecodeParams, Grammar
from specproof.contract.decode_state import OracleGrammar, first_invalid_token, scored_rows
from specproof.engine import EngineGrammar

INV = get("decode.grammar-sampled")
EOS = frozenset({63})
ALPHA = 1e-6 / 12


def _subject(engine: type) -> DecodeSubject:
    return DecodeSubject(
        make_engine=engine,
        make_reference=small_reference,
        vocab_size=64,
        k=4,
        features=frozenset(),
        takes_drafter=True,
        max_prompt=16,
        max_new_tokens=16,
    )


def _example(grammar: Grammar | None = None, *, seed: int = 0) -> SampledDecodeExample:
    params = DecodeParams(grammar=grammar or grammars()[0], eos_token_ids=sorted(EOS))
    return SampledDecodeExample(
        prompt=(1, 2, 3),
        max_new_tokens=16,
        params=params,
        sampling=SAMPLINGS[0],
        first_seed=seed,
        alpha=ALPHA,
        generations=GENERATIONS,
    )


def test_the_drafter_drafts_the_delimiter_then_what_the_grammar_allows_or_one_forbidden_token() -> None:
    grammar = attrs.evolve(grammars()[0], reasoning_end=(18, 19))
    drafter = GrammarWalkDrafter(1, grammar, EOS, 64)
    assert drafter.propose([5], 4)[:2] == [18, 19]  # the delimiter first, then the object
    assert drafter.propose([5, 20, 18], 4)[0] == 19  # the rest of a begun delimiter
    forbidden = 0
    for output in ([], [20], [18, 19], [18, 19, 0, 4], [18, 19, 0, 4, 18, 4, 5], [18, 19, 0, 4, 18, 4, 5, 7, 1]):
        draft = drafter.propose([5, *output], 4)
        assert 1 <= len(draft) <= 4
        at = first_invalid_token(grammar, EOS, 64, [*output, *draft])
        if at is not None:  # a forbidden token only ever ends a draft
            assert at == len(output) + len(draft) - 1
            forbidden += 1
    assert 0 < forbidden < 6


def test_a_fork_walks_ahead_without_moving_the_matcher() -> None:
    oracle = OracleGrammar(grammars()[0], EOS, 64)
    oracle.feed(0)
    twin = oracle.fork()
    twin.feed(4)
    assert oracle.state()["fed"] == 1 and twin.state()["fed"] == 2
    assert oracle.state() != twin.state()


def test_teacher_forced_rows_carry_the_grammar_mask() -> None:
    params = DecodeParams(grammar=grammars()[0], eos_token_ids=sorted(EOS))
    rows = scored_rows(small_reference(), (1, 2, 3), [0, 4], decode=params, eos_token_id=None)
    assert np.isfinite(rows[0]).sum() == 1 and rows[0][0] == 0.0  # only "{" may open the object


@pytest.mark.slow
def test_the_correct_engine_passes_with_a_grammar_and_a_reasoning_delimiter() -> None:
    for grammar in (grammars()[2], attrs.evolve(grammars()[0], reasoning_end=(18,))):
        violations, exercised, note = check_grammar_sampled(INV, _subject(DecodeZooEngine), _example(grammar))
        assert violations == [] and exercised > 0, note


@pytest.mark.parametrize("engine", [GrammarUnmaskedResidualWhenSampling, GrammarNotRolledBack])
def test_a_wrong_sampled_grammar_engine_is_rejected(engine: type) -> None:
    violations, exercised, _ = check_grammar_sampled(INV, _subject(engine), _example())
    assert violations and exercised > 0
    assert all(v.invariant == "decode.grammar-sampled" for v in violations)


class _Unguarded(EngineGrammar):
    """Commits what it is given, allowed or not (an engine that does not check its own output)."""

    def commit_token(self, token: int) -> None:
        if not self.matcher.is_stopped():
            self.matcher.consume_token(token)
        self.fed.append(token)


class _UnguardedUnmaskedResidual(GrammarUnmaskedResidualWhenSampling):
    sampled_processors = type("P", (_UnmaskedResidual,), {"grammar_class": _Unguarded})


def test_a_forbidden_token_is_named_on_the_emitted_prefix_when_the_engine_does_not_refuse_it() -> None:
    violations, _, _ = check_grammar_sampled(INV, _subject(_UnguardedUnmaskedResidual), _example())
    assert violations and "is not allowed there by the json_schema grammar" in violations[0].explanation


@pytest.mark.parametrize("engine", [GrammarUnmaskedResidualWhenSampling, GrammarFollowsArgmaxWhenSampling])
def test_the_sampled_only_members_pass_the_greedy_grammar_check(engine: type) -> None:
    params = DecodeParams(grammar=grammars()[0], eos_token_ids=sorted(EOS))
    example = DecodeExample(
        kind="grammar", prompt=(1, 2, 3), max_new_tokens=16, params=params, eos_token_id=None, schedule=((4, 1),)
    )
    run: GrammarRun = run_grammar_example(_subject(engine), example)
    violations, _, note = check_grammar(get("decode.grammar"), run)
    assert violations == [], note
