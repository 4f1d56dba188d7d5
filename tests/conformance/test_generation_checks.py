"""Per-generation checks: they hold on every real SpecDecoder run and catch hand-made broken records."""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _targets import small_target
from specproof.conformance import check_generation, get
from specproof.conformance.checks import (
    check_accept_bounds,
    check_accept_rule,
    check_cost,
    check_kv_length,
    check_stop,
    check_trace_consistency,
)
from specproof.engine import (
    Generation,
    InvalidSettingError,
    NgramDrafter,
    SpecDecoder,
    Stats,
    Step,
    greedy_decode,
    greedy_with_margins,
)

# the invariants check_generation judges: those applying to a generation on its own
GENERATION_INVARIANTS = (
    "engine.accept-bounds",
    "engine.accept-rule",
    "engine.kv-length",
    "engine.stop",
    "engine.cost",
    "trace.consistency",
)

TARGET = small_target()
SMALL_CONTEXT = small_target(max_context=24)
VOCAB = TARGET.vocab_size


class NoisyOracle:
    """Drafts the true greedy continuation, each token corrupted with probability ``rate`` (seeded per position)."""

    def __init__(self, full: list[int], *, seed: int, rate: float) -> None:
        self.full, self.seed, self.rate = full, seed, rate

    def propose(self, context, k):
        m = len(context)
        rng = random.Random(self.seed * 100_003 + m)
        return [
            t if rng.random() >= self.rate else (t + 1 + rng.randrange(VOCAB - 1)) % VOCAB for t in self.full[m : m + k]
        ]


@st.composite
def runs(draw):
    """A real SpecDecoder generation and the settings it ran with."""
    target = draw(st.sampled_from([TARGET, SMALL_CONTEXT]))
    prompt = draw(
        st.one_of(
            st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=22),
            st.builds(
                lambda u, r: (u * r)[:22],
                st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4),
                st.integers(1, 8),
            ),
        )
    )
    k = draw(st.integers(0, 6))
    rollback = draw(st.sampled_from(["checkpoint", "replay"]))
    max_new = draw(st.integers(0, 30))
    continuation = list(greedy_decode(target, prompt, max_new + k).tokens)
    eos = draw(st.one_of(st.none(), st.integers(0, VOCAB - 1), st.sampled_from(continuation or [0])))
    if draw(st.booleans()):
        drafter = NgramDrafter()
    else:
        drafter = NoisyOracle(
            prompt + continuation, seed=draw(st.integers(0, 9)), rate=draw(st.sampled_from([0.0, 0.3, 1.0]))
        )
    decoder = SpecDecoder(target, drafter, k=k, rollback=rollback)
    gen = decoder.generate(prompt, max_new, eos_token_id=eos)
    return dict(
        generation=gen,
        prompt=prompt,
        k=k,
        max_new_tokens=max_new,
        eos_token_id=eos,
        max_context=target.max_context,
        rollback=rollback,
        final_processed=target.processed,
    )


def _all_pass(results):
    return {inv: [str(v) for v in vs] for inv, vs in results.items() if vs}


@given(runs())
def test_every_check_passes_on_real_generations(run):
    results = check_generation(**run)
    assert set(results) == set(GENERATION_INVARIANTS)
    assert _all_pass(results) == {}


@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    max_new=st.integers(0, 30),
    eos=st.one_of(st.none(), st.integers(0, VOCAB - 1)),
)
def test_plain_greedy_is_a_valid_k0_engine(prompt, max_new, eos):
    gen, _ = greedy_with_margins(SMALL_CONTEXT, prompt, max_new, eos_token_id=eos)
    results = check_generation(
        gen,
        prompt=prompt,
        k=0,
        max_new_tokens=max_new,
        eos_token_id=eos,
        max_context=SMALL_CONTEXT.max_context,
        rollback="checkpoint",
        final_processed=SMALL_CONTEXT.processed,
    )
    assert _all_pass(results) == {}


def test_context_full_and_eos_paths_are_exercised_and_pass():
    """The property above draws these; pin them so a regression in the draw cannot hide them."""
    prompt = list(range(20))
    gen = SpecDecoder(SMALL_CONTEXT, NgramDrafter(), k=4).generate(prompt, 30)
    assert gen.stop_reason == "context_full"
    kw = dict(prompt=prompt, k=4, max_new_tokens=30, max_context=24, rollback="checkpoint")
    assert _all_pass(check_generation(gen, final_processed=SMALL_CONTEXT.processed, **kw)) == {}
    cont = greedy_decode(TARGET, [5, 6, 7], 12).tokens
    eos = cont[5]
    gen = SpecDecoder(TARGET, NgramDrafter(), k=3, rollback="replay").generate([5, 6, 7], 12, eos_token_id=eos)
    assert gen.stop_reason == "eos"
    assert (
        _all_pass(
            check_generation(
                gen,
                prompt=[5, 6, 7],
                k=3,
                max_new_tokens=12,
                eos_token_id=eos,
                rollback="replay",
                final_processed=TARGET.processed,
            )
        )
        == {}
    )


# --------------------------------------------------------------------------- accept bounds


def step(base, draft, argmax, accepted, processed=None):
    return Step(
        base=base,
        draft=draft,
        argmax=argmax,
        accepted=accepted,
        processed=base + len(accepted) if processed is None else processed,
    )


def test_accept_bounds_catches_empty_accepted():
    (v,) = check_accept_bounds(get("engine.accept-bounds"), [step(4, [1], [2, 3], [])], k=2)
    assert v.invariant == "engine.accept-bounds" and v.round == 0 and v.actual == 0
    assert "accepted no token" in v.explanation


def test_accept_bounds_catches_too_many_accepted_and_draft_over_k():
    bad = [step(4, [1], [1, 3], [1, 3]), step(6, [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5])]
    vs = check_accept_bounds(get("engine.accept-bounds"), bad, k=2)
    assert [(v.round, v.actual) for v in vs] == [(1, 3), (1, 5)]
    assert "more than k=2" in vs[0].explanation
    assert "at most one token beyond its draft" in vs[1].explanation


def test_accept_bounds_rejects_bad_k():
    with pytest.raises(InvalidSettingError, match="k=-1 must be an integer >= 0"):
        check_accept_bounds(get("engine.accept-bounds"), [], k=-1)


# --------------------------------------------------------------------------- accept rule


@pytest.mark.parametrize(
    ("draft", "argmax", "accepted", "expected", "phrase"),
    [
        ([1, 2, 3], [1, 9, 3, 4], [1, 2, 3], [1, 9], "after the first mismatch"),
        ([1, 2, 3], [1, 2, 3, 4], [1, 2], [1, 2, 3, 4], "rejected a draft token the target agreed with"),
        ([1, 2], [1, 5, 6], [1, 6], [1, 5], "keep them, then argmax[1]"),
        ([], [7], [8], [7], "keep them, then argmax[0]"),
    ],
)
def test_accept_rule_catches_wrong_acceptance(draft, argmax, accepted, expected, phrase):
    (v,) = check_accept_rule(
        get("engine.accept-rule"), [step(3, [0], [0, 1], [0, 1]), step(5, draft, argmax, accepted)]
    )
    assert v.invariant == "engine.accept-rule" and v.round == 1
    assert v.expected == expected and v.actual == accepted
    assert phrase in v.explanation


def test_accept_rule_catches_wrong_number_of_argmax_rows():
    (v,) = check_accept_rule(get("engine.accept-rule"), [step(3, [1, 2], [1, 2], [1, 2])])
    assert v.expected == 3 and v.actual == 2 and "verify forward" in v.explanation


# --------------------------------------------------------------------------- KV length


def test_kv_length_catches_a_rollback_one_slot_too_far():
    steps = [step(4, [1, 2], [1, 3, 0], [1, 3], processed=5), step(5, [], [7], [7])]
    vs = check_kv_length(get("engine.kv-length"), steps, prompt_length=5, tokens=[1, 3, 7])
    # The end state is wrong too: the last round ends one short of len(ctx) - 1.
    assert [(v.round, v.expected, v.actual) for v in vs] == [(0, 6, 5), (1, 7, 6)]
    assert "rollback left the KV length wrong" in vs[0].explanation


def test_kv_length_catches_a_wrong_start_and_final_length():
    vs = check_kv_length(
        get("engine.kv-length"), [step(3, [], [1], [1])], prompt_length=5, tokens=[1], final_processed=6
    )
    assert [(v.round, v.expected, v.actual) for v in vs] == [(0, 4, 3), (0, 5, 4), (None, 5, 6)]
    assert "prompt length - 1" in vs[0].explanation


def test_kv_length_accepts_a_truncated_last_round_and_checks_it():
    # Last round accepted 3 tokens but only 2 fit max_new_tokens: processed is base + 2.
    steps = [step(4, [], [1], [1]), step(5, [2, 3], [2, 3, 4], [2, 3, 4], processed=7)]
    assert check_kv_length(get("engine.kv-length"), steps, prompt_length=5, tokens=[1, 2, 3], final_processed=7) == []
    bad = attrs.evolve(steps[1], processed=8)
    (v,) = check_kv_length(get("engine.kv-length"), [steps[0], bad], prompt_length=5, tokens=[1, 2, 3])
    assert v.round == 1 and v.expected == 7 and v.actual == 8
    # Without the tokens the last round is only bounded by base + 1 .. base + len(accepted).
    assert check_kv_length(get("engine.kv-length"), [steps[0], bad], prompt_length=5) == []
    (v,) = check_kv_length(get("engine.kv-length"), [steps[0], attrs.evolve(bad, processed=9)], prompt_length=5)
    assert v.expected == "6..8"


# --------------------------------------------------------------------------- stop


def stop(tokens, reason, **kw):
    base = dict(max_new_tokens=4, eos_token_id=9, prompt_length=3, max_context=None)
    base.update(kw)
    return check_stop(get("engine.stop"), tokens, reason, **base)


@pytest.mark.parametrize(
    ("tokens", "reason", "kw", "phrase"),
    [
        ([1, 2], "max_new_tokens", {}, "only 2 of 4 tokens"),
        ([1, 2, 3, 4, 5], "max_new_tokens", {}, "5 tokens were emitted but max_new_tokens is 4"),
        ([1, 9, 2], "eos", {}, "follow the first EOS"),
        ([1, 2], "eos", {}, "not EOS (9)"),
        ([1, 2], "eos", {"eos_token_id": None}, "no EOS token id was set"),
        ([1, 2, 3, 9], "max_new_tokens", {}, "stop reason must be 'eos'"),
        ([1, 2], "context_full", {"max_context": 10}, "it could still take the pending token"),
        ([1, 2, 3, 4], "context_full", {}, "that stop is 'max_new_tokens'"),
        ([1, 2, 3, 4], "max_new_tokens", {"max_context": 5}, "past max_context=5"),
        ([1, 2, 3, 4], "max_new_tokens", {"max_context": 6, "final_processed": 7}, "holds 7 tokens at the end"),
        ([1], "error", {"max_new_tokens": 1}, "stop reason 'error'"),
    ],
)
def test_stop_catches(tokens, reason, kw, phrase):
    vs = stop(tokens, reason, **kw)
    assert vs and all(v.invariant == "engine.stop" for v in vs)
    assert any(phrase in v.explanation for v in vs), [v.explanation for v in vs]


@pytest.mark.parametrize(
    ("tokens", "reason", "kw"),
    [
        ([1, 2, 3, 4], "max_new_tokens", {}),
        ([1, 9], "eos", {}),
        ([1, 2], "context_full", {"max_context": 4}),
        ([], "max_new_tokens", {"max_new_tokens": 0}),
        ([], "context_full", {"max_context": 2}),
    ],
)
def test_stop_passes_valid_endings(tokens, reason, kw):
    assert stop(tokens, reason, **kw) == []


# --------------------------------------------------------------------------- cost


def _gen(tokens, steps, **stats):
    defaults = dict(
        rounds=len(steps),
        emitted=len(tokens),
        prefill_forwards=1,
        verify_forwards=len(steps),
        replay_forwards=0,
        drafted=sum(len(s.draft) for s in steps),
        accepted=sum(len(s.accepted) - 1 for s in steps),
    )
    defaults.update(stats)
    return Generation(tokens=tokens, stop_reason="max_new_tokens", steps=tuple(steps), stats=Stats(**defaults))


REJECTING = [step(4, [1, 2], [1, 5, 0], [1, 5]), step(6, [3], [3, 8], [3, 8])]


def test_cost_passes_honest_counts():
    assert check_cost(get("engine.cost"), _gen([1, 5, 3, 8], REJECTING), rollback="checkpoint") == []
    assert check_cost(get("engine.cost"), _gen([1, 5, 3, 8], REJECTING, replay_forwards=1), rollback="replay") == []


@pytest.mark.parametrize(
    ("rollback", "stats", "phrase"),
    [
        ("checkpoint", {"replay_forwards": 1}, "restoring a checkpoint costs no forward"),
        ("replay", {"replay_forwards": 2}, "only 1 round(s) needed a rollback"),
        ("replay", {"verify_forwards": 3}, "each round is exactly one verify"),
        (None, {"emitted": 3}, "stats.emitted is 3"),
        (None, {"rounds": 3, "verify_forwards": 3}, "but 2 rounds were recorded"),
        (None, {"drafted": 1}, "stats.drafted is 1"),
        (None, {"accepted": 0}, "stats.accepted is 0"),
    ],
)
def test_cost_catches(rollback, stats, phrase):
    vs = check_cost(get("engine.cost"), _gen([1, 5, 3, 8], REJECTING, **stats), rollback=rollback)
    assert vs and all(v.invariant == "engine.cost" for v in vs)
    assert any(phrase in v.explanation for v in vs), [v.explanation for v in vs]


def test_cost_allows_a_chunked_prefill_but_not_more_forwards_than_tokens():
    gen = _gen([1, 5, 3, 8], REJECTING, prefill_forwards=3)
    assert check_cost(get("engine.cost"), gen, rollback="checkpoint", prompt_length=4) == []  # 3 tokens fed in 3 chunks
    vs = check_cost(
        get("engine.cost"), _gen([1, 5, 3, 8], REJECTING, prefill_forwards=4), rollback="checkpoint", prompt_length=4
    )
    assert any("4 prefill forwards for a 4-token prompt" in v.explanation for v in vs)


def test_cost_catches_a_round_that_emits_nothing():
    steps = [step(4, [], [1], [1]), step(5, [], [2], [])]
    vs = check_cost(get("engine.cost"), _gen([1], steps), rollback=None)
    assert any(v.round == 1 and "emitted 0 tokens" in v.explanation for v in vs)


def test_cost_counts_a_truncated_last_round_as_needing_a_rollback():
    # Everything accepted, but max_new_tokens cut the last round: replay must roll back there.
    steps = [step(4, [1, 2], [1, 2, 3], [1, 2, 3], processed=6)]
    assert check_cost(get("engine.cost"), _gen([1, 2], steps, replay_forwards=1, accepted=2), rollback="replay") == []


def test_cost_rejects_an_unknown_rollback():
    with pytest.raises(InvalidSettingError, match="rollback"):
        check_cost(get("engine.cost"), _gen([], []), rollback="rewind")


# --------------------------------------------------------------------------- trace consistency


def test_consistency_catches_tokens_that_are_not_the_accepted_tokens():
    (v,) = check_trace_consistency(
        get("trace.consistency"), [1, 5, 3, 9], REJECTING, "max_new_tokens", max_new_tokens=4, eos_token_id=None
    )
    assert v.invariant == "trace.consistency" and v.round == 1
    assert v.expected == [1, 5, 3, 8] and "from index 3" in v.explanation


def test_consistency_catches_a_round_after_the_output_was_complete():
    steps = [step(4, [1, 2], [1, 2, 3], [1, 2, 3]), step(7, [], [4], [4])]
    vs = check_trace_consistency(
        get("trace.consistency"), [1, 2], steps, "max_new_tokens", max_new_tokens=2, eos_token_id=None
    )
    assert any(v.round == 1 and "after the output was already complete" in v.explanation for v in vs)
    vs = check_trace_consistency(get("trace.consistency"), [1, 2], steps, "eos", max_new_tokens=10, eos_token_id=2)
    assert any("eos reached in round 0" in v.explanation for v in vs)


def test_consistency_catches_a_stop_reason_the_rounds_do_not_give():
    (v,) = check_trace_consistency(
        get("trace.consistency"), [1, 5, 3, 8], REJECTING, "eos", max_new_tokens=4, eos_token_id=None
    )
    assert v.expected == "max_new_tokens" and v.actual == "eos"
    (v,) = check_trace_consistency(
        get("trace.consistency"), [1, 5, 3, 8], REJECTING, "max_new_tokens", max_new_tokens=9, eos_token_id=None
    )
    assert v.expected == "context_full"


def test_consistency_passes_truncation_in_the_last_round():
    assert (
        check_trace_consistency(
            get("trace.consistency"), [1, 5, 3], REJECTING, "max_new_tokens", max_new_tokens=3, eos_token_id=None
        )
        == []
    )
    assert (
        check_trace_consistency(
            get("trace.consistency"), [1, 5], REJECTING[:1], "eos", max_new_tokens=9, eos_token_id=5
        )
        == []
    )


# --------------------------------------------------------------------------- check_generation


def test_check_generation_runs_only_what_applies():
    gen = Generation(tokens=[1, 2], stop_reason="max_new_tokens")
    assert set(check_generation(gen, prompt=[0], k=2, max_new_tokens=2)) == {"engine.stop"}
    with_stats = attrs.evolve(gen, stats=Stats(rounds=1, emitted=2, verify_forwards=1))
    # engine.cost needs stats and a rollback strategy (its needs in the registry)
    assert set(check_generation(with_stats, prompt=[0], k=2, max_new_tokens=2)) == {"engine.stop"}
    assert set(check_generation(with_stats, prompt=[0], k=2, max_new_tokens=2, rollback="replay")) == {
        "engine.stop",
        "engine.cost",
    }
    no_stats = Generation(tokens=[1, 5, 3, 8], stop_reason="max_new_tokens", steps=REJECTING)
    results = check_generation(no_stats, prompt=[0, 0, 0, 0, 0], k=2, max_new_tokens=4)
    assert set(results) == set(GENERATION_INVARIANTS) - {"engine.cost"}
    assert _all_pass(results) == {}


@given(runs(), st.data())
def test_check_generation_catches_a_tampered_real_generation(run, data):
    gen = run["generation"]
    if not gen.steps:
        return
    i = data.draw(st.integers(0, len(gen.steps) - 1), label="round")
    s = gen.steps[i]
    # Swap the round's own token for another one: the accept rule no longer holds.
    bad_last = (s.accepted[-1] + 1) % VOCAB
    tampered = attrs.evolve(s, accepted=(*s.accepted[:-1], bad_last))
    steps = (*gen.steps[:i], tampered, *gen.steps[i + 1 :])
    call = dict(run, generation=attrs.evolve(gen, steps=steps))
    results = check_generation(**call)
    assert [v.round for v in results["engine.accept-rule"]] == [i]
    # Shift the KV length of the round: kv-length names it.
    shifted = attrs.evolve(s, processed=s.processed + 1)
    steps = (*gen.steps[:i], shifted, *gen.steps[i + 1 :])
    results = check_generation(**dict(run, generation=attrs.evolve(gen, steps=steps)))
    assert results["engine.kv-length"] and results["engine.kv-length"][0].round == i
