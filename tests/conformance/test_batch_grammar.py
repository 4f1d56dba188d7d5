"""batch.grammar (docs/contract.md, "Decode state", "Batches"): requests with their own grammars batched together;
it rejects an engine that shares one matcher between requests or rolls a row's rejection back on a neighbour's
matcher, greedy and sampled, and accepts correct engines that batch differently, exercised; the schedules draw
grammars only when asked (every other batch check's draws unchanged)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import given, settings

from specproof.conformance._registry import get
from specproof.conformance.checks.batch import BatchSubject
from specproof.conformance.checks.batch_grammar import check_batch_grammar, grammar_request
from specproof.conformance.checks.decode_grammar import grammars
from specproof.conformance.zoo import _batch_engines as zoo
from specproof.conformance.zoo._batch_grammar_engines import (
    BatchGrammarRollbackWrongRequest,
    BatchScratchMatchers,
    BatchSharedGrammarMatcher,
)
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import DecodeParams
from specproof.contract.decode_state import first_invalid_token
from specproof.engine import greedy_decode
from specproof.strategies import BatchSchedule, PlannedRound, RoundPlan, ScheduledRequest, batch_schedules

GRAMMARS = grammars()

INV = get("batch.grammar")


def _subject(engine: Callable[[], Any]) -> BatchSubject:
    def greedy(prompt: Any, n: int, eos: int | None) -> list[int]:
        return list(greedy_decode(small_reference(), list(prompt), n, eos_token_id=eos).tokens)

    return BatchSubject(
        make_engine=engine,
        greedy=greedy,
        vocab_size=64,
        k=4,
        capabilities=engine().batch_capabilities,
        make_reference=small_reference,
    )


def _request(prompt: tuple[int, ...], grammar: int, *rounds: tuple[int, int], **fields: Any) -> ScheduledRequest:
    plan = RoundPlan(tuple(PlannedRound(n, c) for n, c in rounds))
    return ScheduledRequest(prompt=prompt, max_new_tokens=10, plan=plan, grammar=GRAMMARS[grammar], **fields)


# two requests with different grammars, each rejecting inside its blocks, and one with a reasoning delimiter
GREEDY = BatchSchedule(
    requests=(
        _request((1, 2, 3), 0, (4, 2), (4, 1)),
        _request((5, 2, 3), 2, (4, 1), (3, 3)),
        _request((7, 7), 1, (4, 4), (2, 0), delimiter_at=1, delimiter_length=2),
    )
)
SAMPLED = BatchSchedule(
    requests=tuple(attrs.evolve(r, seed=i + 11) for i, r in enumerate(GREEDY.requests[:2])) + GREEDY.requests[2:]
)
WRONG = [BatchSharedGrammarMatcher, BatchGrammarRollbackWrongRequest]
CORRECT = [
    zoo.BatchZooEngine,
    zoo.BatchReplayEngine,
    zoo.BatchFifoTwoRows,
    zoo.BatchRecomputeOnly,
    BatchScratchMatchers,
]


@pytest.mark.parametrize("schedule", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("engine", WRONG, ids=lambda e: e.__name__)
def test_a_matcher_not_kept_per_request_is_rejected(engine: type, schedule: BatchSchedule) -> None:
    violations, exercised, _ = check_batch_grammar(INV, _subject(engine), schedule)
    assert violations and exercised > 0
    assert all(v.invariant == "batch.grammar" for v in violations)


@pytest.mark.parametrize("engine", WRONG, ids=lambda e: e.__name__)
def test_alone_each_wrong_engine_is_right(engine: type) -> None:
    for request in GREEDY.requests:
        violations, _, _ = check_batch_grammar(INV, _subject(engine), BatchSchedule(requests=(request,)))
        assert violations == []


@pytest.mark.parametrize("schedule", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("engine", CORRECT, ids=lambda e: e.__name__)
def test_correct_engines_that_batch_differently_pass(engine: type, schedule: BatchSchedule) -> None:
    violations, exercised, note = check_batch_grammar(INV, _subject(engine), schedule)
    assert violations == [] and exercised == 3, note


def test_a_request_gets_its_grammar_after_its_delimiter_and_the_grammar_eos() -> None:
    built = grammar_request(_subject(zoo.BatchZooEngine), 2, GREEDY.requests[2])
    decode = built.request.decode
    assert isinstance(decode, DecodeParams) and decode.grammar is not None
    assert len(decode.grammar.reasoning_end) == 2 and decode.eos_token_ids == (63,)
    assert built.expected is not None
    assert first_invalid_token(decode.grammar, frozenset({63}), 64, built.expected.tokens) is None


def test_a_schedule_without_a_grammar_is_not_exercised_and_says_so() -> None:
    plain = BatchSchedule(requests=tuple(attrs.evolve(r, grammar=None) for r in GREEDY.requests))
    assert check_batch_grammar(INV, _subject(zoo.BatchZooEngine), plain) == (
        [],
        0,
        "no request of the schedule carried a grammar",
    )


@settings(max_examples=20)
@given(batch_schedules(vocab_size=64, k=4, max_requests=3, max_new_tokens=6, max_prompt=5))
def test_without_grammars_a_schedule_draws_none(schedule: BatchSchedule) -> None:
    assert all(r.grammar is None and r.delimiter_at is None for r in schedule.requests)


@settings(max_examples=20)
@given(batch_schedules(vocab_size=64, k=4, max_requests=3, max_new_tokens=6, max_prompt=5, grammars=GRAMMARS))
def test_with_grammars_a_delimiter_ends_inside_the_budget(schedule: BatchSchedule) -> None:
    for r in schedule.requests:
        assert r.grammar is None or r.grammar in GRAMMARS
        assert r.delimiter_at is None or (r.grammar is not None and 0 <= r.delimiter_at < r.max_new_tokens)
