"""specproof.strategies: each strategy generates what it documents, shrinks as documented, and
scripted decoding cases drive SpecDecoder through every accept/reject path losslessly."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from _targets import small_target
from specproof.engine import InvalidSettingError, SpecDecoder, greedy_decode, longest_accepted_prefix
from specproof.strategies import (
    CONTEXT_KINDS,
    ROUND_KINDS,
    DecodingCase,
    EngineSettings,
    PlannedRound,
    RoundPlan,
    ScriptedDrafter,
    ScriptMismatchError,
    contexts,
    decoding_cases,
    engine_settings,
    planned_round,
    round_plans,
    text_tokens,
)

TARGET = small_target()
VOCAB = TARGET.vocab_size


# --------------------------------------------------------------------------- helpers


def min_period_distance(x: list[int]) -> int:
    """The fewest changes that make ``x`` periodic with a unit of at most max(1, len // 2) tokens."""
    best = len(x)
    for p in range(1, max(1, len(x) // 2) + 1):
        changes = 0
        for r in range(p):
            column = x[r::p]
            changes += len(column) - Counter(column).most_common(1)[0][1]
        best = min(best, changes)
    return best


def is_text_window(x: list[int], vocab_size: int) -> bool:
    return bytes(x) in bytes(text_tokens(min(vocab_size, 256)))


def exists(strategy, condition):
    """The first generated example satisfying ``condition``: ``find`` without shrinking, for speed.

    ``max_examples`` is ``find``'s own default search cap; the search stops at the first hit.
    """
    return find(strategy, condition, settings=settings(max_examples=2000, phases=[Phase.generate], database=None))


def minimal(strategy, condition):
    """``find``: the shrunk example, without the (slow, tracing) explain phase."""
    return find(
        strategy, condition, settings=settings(max_examples=2000, phases=[Phase.generate, Phase.shrink], database=None)
    )


def rounds_of(plan: RoundPlan) -> list[tuple[int, int]]:
    return [(r.draft_length, r.correct) for r in plan.rounds]


# --------------------------------------------------------------------------- contexts


@pytest.mark.parametrize("vocab", [2, 32, 300])
@given(data=st.data())
def test_every_kind_respects_sizes_and_vocabulary(vocab, data):
    kind = data.draw(st.sampled_from(CONTEXT_KINDS), label="kind")
    lo = data.draw(st.integers(0, 10), label="min_size")
    hi = data.draw(st.integers(lo, 40), label="max_size")
    x = data.draw(contexts(vocab, min_size=lo, max_size=hi, kinds=[kind]), label="context")
    assert lo <= len(x) <= hi
    assert all(type(t) is int and 0 <= t < vocab for t in x)


@given(x=contexts(VOCAB, kinds=["constant"]))
def test_constant_runs_repeat_one_token(x):
    assert len(set(x)) == 1


@given(x=contexts(VOCAB, min_size=2, kinds=["periodic"]))
def test_periodic_contexts_repeat_a_short_unit(x):
    assert min_period_distance(x) == 0


@given(x=contexts(VOCAB, min_size=2, kinds=["copy_spans"]))
def test_copy_span_contexts_repeat_an_earlier_span(x):
    assert len(set(x)) < len(x)


@given(x=contexts(VOCAB, min_size=1, kinds=["near_periodic"]))
def test_near_periodic_contexts_are_a_few_mutations_from_periodic(x):
    assert min_period_distance(x) <= max(1, len(x) // 4)


@pytest.mark.parametrize("vocab", [32, 256, 1000])
@given(data=st.data())
def test_text_contexts_are_windows_of_the_stdlib_corpus(vocab, data):
    x = data.draw(contexts(vocab, min_size=1, kinds=["text"]), label="text")
    assert is_text_window(x, vocab)


def test_text_tokens_are_bytes_mod_vocab():
    raw = text_tokens(256)
    assert len(raw) > 10_000  # docstrings and sources were found
    assert text_tokens(32) == tuple(b % 32 for b in raw)
    assert text_tokens(50_000) == raw
    assert b"Text wrapping" in bytes(raw[:200])  # prose first: text shrinks toward a docstring


def test_kinds_are_really_drawn_from_the_mixture():
    mixture = contexts(VOCAB, max_size=48)
    assert len(set(minimal(mixture, lambda x: len(x) >= 6))) == 1  # shrinks to a constant run
    text = exists(mixture, lambda x: len(x) >= 16 and len(set(x)) >= 8 and is_text_window(x, VOCAB))
    assert is_text_window(text, VOCAB)
    mutated = exists(mixture, lambda x: len(x) >= 12 and min_period_distance(x) == 1)
    assert min_period_distance(mutated) == 1
    copied = exists(mixture, lambda x: len(x) >= 12 and min_period_distance(x) > 3 and len(set(x)) < len(x) // 2)
    assert len(set(copied)) < len(copied) // 2


def test_contexts_shrink_toward_short_constant_runs():
    assert minimal(contexts(VOCAB, max_size=64), lambda x: len(x) >= 5) == [0] * 5
    assert minimal(contexts(VOCAB, kinds=["random"]), lambda x: sum(x) >= 1) == [1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(vocab_size=0), "vocab_size=0"),
        (dict(vocab_size=8, min_size=5, max_size=2), "max_size=2 must be >= min_size=5"),
        (dict(vocab_size=8, kinds=["bogus"]), "unknown kind 'bogus'"),
        (dict(vocab_size=8, kinds="text"), "not a string"),
        (dict(vocab_size=8, kinds=[]), "selects nothing"),
        (dict(vocab_size=8, min_size=-1), "min_size=-1"),
        (dict(vocab_size=8, min_size=10**7, max_size=10**7, kinds=["text"]), "longer than the text corpus"),
    ],
)
def test_contexts_reject_bad_arguments_up_front(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        contexts(**kwargs)


# --------------------------------------------------------------------------- round plans


def test_planned_round_validates_and_names_its_kind():
    assert PlannedRound(0, 0).kind == "empty_draft"
    assert PlannedRound(3, 3).kind == "all_accepted"
    assert PlannedRound(3, 0).kind == "rejected_at_0"
    assert PlannedRound(3, 1).kind == "partial"
    with pytest.raises(InvalidSettingError, match="correct=4 must be <= draft_length=3"):
        PlannedRound(3, 4)
    with pytest.raises(InvalidSettingError, match="draft_length=-1"):
        PlannedRound(-1, 0)
    with pytest.raises(InvalidSettingError, match="at least one"):
        RoundPlan(())


@given(k=st.integers(0, 8), data=st.data())
def test_plans_fit_k_and_the_round_count(k, data):
    lo = data.draw(st.integers(1, 6), label="min_rounds")
    hi = data.draw(st.integers(lo, 12), label="max_rounds")
    plan = data.draw(round_plans(k=k, min_rounds=lo, max_rounds=hi), label="plan")
    assert lo <= len(plan) <= hi
    for r in plan.rounds:
        assert r.correct <= r.draft_length <= k
    if k == 0:
        assert set(rounds_of(plan)) == {(0, 0)}


ROUND_KIND_PREDICATES = {
    "all_accepted": lambda rs: (4, 4) in rs,
    "empty_draft": lambda rs: (0, 0) in rs,
    "rejected_at_0": lambda rs: (4, 0) in rs,
    "partial": lambda rs: any(n == 4 and 0 < c < 4 for n, c in rs),
    "short_draft": lambda rs: any(0 < n < 4 for n, _ in rs),
    "full_then_empty": lambda rs: any(a == (4, 4) and b == (0, 0) for a, b in itertools.pairwise(rs)),
}


@pytest.mark.parametrize("kind", ROUND_KINDS)
def test_every_round_kind_is_reachable(kind):
    predicate = ROUND_KIND_PREDICATES[kind]
    plan = exists(round_plans(k=4), lambda p: predicate(rounds_of(p)))
    assert predicate(rounds_of(plan))
    # and selecting the kind alone gives only that kind
    only = exists(round_plans(k=4, kinds=[kind], min_rounds=2), lambda p: True)
    assert predicate(rounds_of(only))


def test_plans_shrink_to_one_fully_accepted_round():
    assert rounds_of(minimal(round_plans(k=5), lambda p: True)) == [(5, 5)]
    assert minimal(planned_round(k=5), lambda r: True) == PlannedRound(5, 5)


@given(k=st.integers(0, 1), data=st.data())
def test_small_k_leaves_out_kinds_that_need_more(k, data):
    plan = data.draw(round_plans(k=k, kinds=["partial", "short_draft"]), label="plan")
    assert set(rounds_of(plan)) == {(0, 0)}  # nothing else fits: an empty draft is the only round


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(k=-1), "k=-1"),
        (dict(k=2, min_rounds=0), "min_rounds=0"),
        (dict(k=2, min_rounds=3, max_rounds=2), "max_rounds=2"),
        (dict(k=2, kinds=["nope"]), "unknown kind 'nope'"),
    ],
)
def test_round_plans_reject_bad_arguments(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        round_plans(**kwargs)


# --------------------------------------------------------------------------- scripted drafter


@given(prompt=contexts(VOCAB, max_size=20), plan=round_plans(k=6), k=st.integers(0, 8), data=st.data())
def test_scripted_drafts_are_right_for_exactly_correct_tokens(prompt, plan, k, data):
    continuation = list(greedy_decode(TARGET, prompt, 24).tokens)
    drafter = ScriptedDrafter(prompt, continuation, plan, vocab_size=VOCAB)
    for r in range(len(plan) + 2):  # past the end: the plan cycles
        pos = data.draw(st.integers(0, len(continuation)), label=f"position in round {r}")
        draft = drafter.propose(prompt + continuation[:pos], k)
        planned = plan.round_at(r)
        truth = continuation[pos:]
        assert len(draft) == min(planned.draft_length, k, len(truth))
        assert longest_accepted_prefix(draft, truth) == min(planned.correct, len(draft))
        assert all(0 <= t < VOCAB for t in draft)
    drafter.reset()
    assert drafter.rounds_done == 0 and drafter.calls == []


def test_scripted_drafter_checks_its_context_and_arguments():
    plan = RoundPlan((PlannedRound(2, 1),))
    drafter = ScriptedDrafter([1, 2, 3], [4, 5, 6], plan, vocab_size=8)
    assert drafter.propose([1, 2, 3], 4) == [4, 6]  # index 1 replaced by (5 + 1) % 8
    with pytest.raises(ScriptMismatchError, match="first difference at index 1"):
        drafter.propose([1, 9, 3, 4], 2)
    with pytest.raises(ScriptMismatchError, match="does not start with the scripted prompt"):
        drafter.propose([1, 2], 2)
    with pytest.raises(InvalidSettingError, match="vocab_size=1"):
        ScriptedDrafter([0], [0], plan, vocab_size=1)
    with pytest.raises(InvalidSettingError, match="prompt is empty"):
        ScriptedDrafter([], [1], plan, vocab_size=8)
    with pytest.raises(InvalidSettingError, match="must be a RoundPlan"):
        ScriptedDrafter([1], [1], [PlannedRound(1, 1)], vocab_size=8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"continuation\[1\]=9"):
        ScriptedDrafter([1], [1, 9], plan, vocab_size=8)


def test_wrong_token_wraps_around_the_vocabulary():
    drafter = ScriptedDrafter([0], [7, 7], RoundPlan((PlannedRound(2, 0),)), vocab_size=8)
    assert drafter.propose([0], 2) == [0, 7]


# --------------------------------------------------------------------------- engine settings


@given(s=engine_settings(max_k=5, eos_candidates=[3, 4], vocab_size=VOCAB, rollbacks=("replay",)))
def test_engine_settings_stay_in_bounds(s):
    assert 0 <= s.k <= 5 and 1 <= s.max_new_tokens <= 48
    assert s.eos_token_id is None or 0 <= s.eos_token_id < VOCAB
    assert s.rollback == "replay"


def test_engine_settings_reach_each_choice():
    strat = engine_settings(max_k=6, eos_candidates=[9], vocab_size=VOCAB)
    assert minimal(strat, lambda s: True) == EngineSettings(
        k=0, max_new_tokens=1, eos_token_id=None, rollback="checkpoint"
    )
    assert exists(strat, lambda s: s.eos_token_id == 9).eos_token_id == 9
    assert 0 <= exists(strat, lambda s: s.eos_token_id not in (None, 9)).eos_token_id < VOCAB  # a random id
    assert exists(strat, lambda s: s.k == 6 and s.rollback == "replay").k == 6


@given(s=engine_settings(max_k=3))
def test_without_candidates_or_vocabulary_eos_is_none(s):
    assert s.eos_token_id is None and s.k <= 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_k=-1), "max_k=-1"),
        (dict(rollbacks=("rewind",)), "unknown rollback 'rewind'"),
        (dict(rollbacks="replay"), "not a string"),
        (dict(eos_candidates=[40], vocab_size=32), r"eos_candidates\[0\]=40 is outside"),
        (dict(max_new_tokens=-2), "max_new_tokens=-2"),
    ],
)
def test_engine_settings_reject_bad_arguments(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        engine_settings(**kwargs)


def test_engine_settings_record_validates():
    with pytest.raises(InvalidSettingError, match="rollback='rewind'"):
        EngineSettings(k=1, max_new_tokens=2, rollback="rewind")
    with pytest.raises(InvalidSettingError, match="k=-1"):
        EngineSettings(k=-1, max_new_tokens=2)


# --------------------------------------------------------------------------- decoding cases


def run_case(case: DecodingCase):
    """Run the case on a fresh target with SpecDecoder; returns the target, the generation and the drafter."""
    target = small_target()
    settings = case.settings
    drafter = case.drafter(target.vocab_size)
    decoder = settings.decoder(target, drafter)
    gen = decoder.generate(list(case.prompt), settings.max_new_tokens, eos_token_id=settings.eos_token_id)
    return target, gen, drafter


@given(case=decoding_cases(small_target, max_k=6, max_new_tokens=st.integers(1, 24)))
def test_decoding_cases_are_lossless_on_spec_decoder(case):
    target, gen, _ = run_case(case)
    # the case's expectation is plain greedy with the same EOS
    settings = case.settings
    oracle = greedy_decode(small_target(), case.prompt, settings.max_new_tokens, eos_token_id=settings.eos_token_id)
    assert case.expected_tokens == oracle.tokens, case.describe()
    assert gen.tokens == case.expected_tokens, case.describe()
    assert target.processed == len(case.prompt) + len(gen.tokens) - 1, case.describe()
    if case.placement == "near_max_context":
        assert len(case.prompt) >= target.max_context - 6 - 1  # max_k + 1 slots at most are left


def test_decoding_cases_take_every_path():
    seen: Counter[str] = Counter()

    # a coverage claim, so its examples are fixed: under the random dev profile 15 draws missed a path half the time
    @settings(max_examples=25, derandomize=True, database=None)
    @given(case=decoding_cases(small_target, max_k=6, max_new_tokens=st.integers(8, 24)))
    def collect(case):
        _, gen, _ = run_case(case)
        assert gen.tokens == case.expected_tokens, case.describe()
        for step in gen.steps:
            if not step.draft:
                seen["empty_draft"] += 1
            elif len(step.accepted) == len(step.draft) + 1:
                seen["all_accepted"] += 1
            elif len(step.accepted) == 1:
                seen["rejected_at_0"] += 1
            else:
                seen["partial"] += 1
        if case.settings.eos_token_id is not None and gen.stop_reason == "eos":
            seen["eos"] += 1
        if gen.stop_reason == "context_full":
            seen["context_full"] += 1

    collect()
    assert {"empty_draft", "all_accepted", "rejected_at_0", "partial", "eos"} <= set(seen), seen


def test_near_max_context_cases_clamp_drafts():
    case = exists(
        decoding_cases(small_target, max_k=6, max_new_tokens=st.integers(12, 16), placements=["near_max_context"]),
        lambda c: c.settings.eos_token_id is None and any(k < c.settings.k for _, _, k, _ in run_case(c)[2].calls),
    )
    target, gen, drafter = run_case(case)
    assert gen.stop_reason == "context_full"
    assert gen.tokens == case.expected_tokens
    assert len(case.prompt) + len(gen.tokens) == target.max_context + 1
    # the engine asked for less than k once the context was nearly full, and every verify fitted
    assert any(k < case.settings.k for _, _, k, _ in drafter.calls)
    assert all(step.base + len(step.draft) + 1 <= target.max_context for step in gen.steps)
    assert "near max_context" in case.describe()


def test_decoding_cases_validate_arguments():
    with pytest.raises(InvalidArgument, match="must be a callable"):
        decoding_cases(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="max_rounds=0"):
        decoding_cases(small_target, max_rounds=0)
    with pytest.raises(InvalidArgument, match="unknown kind"):
        decoding_cases(small_target, context_kinds=["poetry"])
    with pytest.raises(InvalidArgument, match="unknown kind 'middle'"):
        decoding_cases(small_target, placements=["middle"])


def test_case_helpers():
    plan = RoundPlan((PlannedRound(2, 1),))
    settings = EngineSettings(k=2, max_new_tokens=3, eos_token_id=5, rollback="replay")
    case = DecodingCase(prompt=[1, 2], continuation=[4, 5, 6], settings=settings, plan=plan)
    assert case.expected_tokens == (4, 5)
    assert isinstance(case.decoder(small_target()), SpecDecoder)
    assert case.drafter(VOCAB).propose([1, 2], 2) == [4, 6]
    assert "plan=[partial(1/2)]" in case.describe() and "rollback=replay" in case.describe()
