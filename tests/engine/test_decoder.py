"""SpecDecoder: lossless against the greedy oracle, the round rules, stopping, costs and error paths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _targets import small_target
from specproof.engine import (
    DecodeError,
    DrafterContractError,
    EmptyPromptError,
    InvalidSettingError,
    NgramDrafter,
    PromptTooLongError,
    SpecDecoder,
    TokenRangeError,
    greedy_decode,
)

TARGET = small_target()
VOCAB = TARGET.vocab_size


class CountingTarget:
    """Wraps a target and counts forwards (the decoder's own stats are checked against it)."""

    def __init__(self, inner):
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.max_context = inner.max_context
        self.forwards = 0

    @property
    def processed(self):
        return self.inner.processed

    def forward(self, tokens):
        self.forwards += 1
        return self.inner.forward(tokens)

    def forward_with_checkpoints(self, tokens):
        self.forwards += 1
        return self.inner.forward_with_checkpoints(tokens)

    def snapshot(self):
        return self.inner.snapshot()

    def restore(self, snap):
        self.inner.restore(snap)

    def reset(self):
        self.inner.reset()


class OracleDrafter:
    """Proposes the true greedy continuation, corrupted at draft position ``wrong_at`` (None: never)."""

    def __init__(self, prompt, continuation, wrong_at=None, length=None):
        self.full = list(prompt) + list(continuation)
        self.wrong_at = wrong_at
        self.length = length

    def propose(self, context, k):
        m = len(context)
        n = k if self.length is None else min(k, self.length)
        draft = self.full[m : m + n]
        if self.wrong_at is not None and self.wrong_at < len(draft):
            draft[self.wrong_at] = (draft[self.wrong_at] + 1) % VOCAB
        return draft


prompts = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    st.builds(
        lambda unit, reps: (unit * reps)[:30],
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4),
        st.integers(1, 10),
    ),
)


@given(
    prompt=prompts,
    k=st.integers(0, 8),
    rollback=st.sampled_from(["checkpoint", "replay"]),
    max_new=st.integers(0, 40),
    drafter=st.sampled_from(["ngram", "ngram-earliest"]),
)
def test_lossless_against_greedy(prompt, k, rollback, max_new, drafter):
    d = NgramDrafter(prefer="earliest") if drafter == "ngram-earliest" else NgramDrafter()
    gen = SpecDecoder(TARGET, d, k=k, rollback=rollback).generate(prompt, max_new)
    ref = greedy_decode(TARGET, prompt, max_new)
    assert gen.tokens == ref.tokens
    assert gen.stop_reason == ref.stop_reason
    assert TARGET.processed == len(prompt) + len(gen.tokens) - 1


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize("k", range(9))
def test_every_k_on_a_repetitive_prompt(k, rollback):
    prompt = [1, 2, 3, 4, 5] * 5
    gen = SpecDecoder(TARGET, NgramDrafter(), k=k, rollback=rollback).generate(prompt, 30)
    assert gen.tokens == greedy_decode(TARGET, prompt, 30).tokens


@given(
    prompt=prompts,
    k=st.integers(1, 8),
    wrong_at=st.one_of(st.none(), st.integers(0, 7)),
    rollback=st.sampled_from(["checkpoint", "replay"]),
)
def test_round_rules_and_costs_with_scripted_drafts(prompt, k, wrong_at, rollback):
    ref = greedy_decode(TARGET, prompt, 24)
    target = CountingTarget(small_target())
    gen = SpecDecoder(target, OracleDrafter(prompt, ref.tokens, wrong_at), k=k, rollback=rollback).generate(prompt, 24)
    assert gen.tokens == ref.tokens
    stats = gen.stats
    assert stats.target_forwards == target.forwards
    assert stats.verify_forwards == stats.rounds == len(gen.steps)
    rejected = sum(1 for s in gen.steps if len(s.accepted) <= len(s.draft))
    if rollback == "checkpoint":
        assert stats.replay_forwards == 0
    else:
        assert stats.replay_forwards <= rejected
    for step in gen.steps:
        assert 1 <= len(step.accepted) <= len(step.draft) + 1 <= k + 1
        j = len(step.accepted) - 1
        assert list(step.accepted) == [*step.draft[:j], step.argmax[j]]
        assert step.draft[:j] == step.argmax[:j]
        assert j == len(step.draft) or step.draft[j] != step.argmax[j]
    for step in gen.steps[:-1]:
        assert step.processed == step.base + len(step.accepted)
    if wrong_at is None:  # all drafts right: never any rollback work
        assert stats.replay_forwards == 0
        assert stats.mean_tokens_per_round > 1 or stats.rounds <= 1


def test_checkpoint_strategy_is_one_forward_per_round():
    prompt = [7, 8, 9] * 6
    ref = greedy_decode(TARGET, prompt, 40)
    target = CountingTarget(small_target())
    gen = SpecDecoder(target, OracleDrafter(prompt, ref.tokens, wrong_at=1), k=4).generate(prompt, 40)
    assert target.forwards == gen.stats.rounds + 1  # + the prefill
    assert gen.stats.prefill_forwards == 1 and gen.stats.replay_forwards == 0


def test_replay_costs_one_extra_forward_per_rejecting_round():
    prompt = [7, 8, 9] * 6
    ref = greedy_decode(TARGET, prompt, 40)
    gen = SpecDecoder(small_target(), OracleDrafter(prompt, ref.tokens, wrong_at=1), k=4, rollback="replay").generate(
        prompt, 40
    )
    rejecting = sum(1 for s in gen.steps if len(s.accepted) <= len(s.draft))
    assert gen.stats.replay_forwards == rejecting > 0


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_eos_inside_an_accepted_draft_stops_there(rollback):
    prompt = [3, 1, 4, 1, 5]
    ref = greedy_decode(TARGET, prompt, 30)
    eos = ref.tokens[5]
    first = ref.tokens.index(eos)
    target = small_target()
    gen = SpecDecoder(target, OracleDrafter(prompt, ref.tokens), k=8, rollback=rollback).generate(
        prompt, 30, eos_token_id=eos
    )
    assert gen.tokens == ref.tokens[: first + 1]
    assert gen.stop_reason == "eos"
    assert target.processed == len(prompt) + len(gen.tokens) - 1
    assert gen.tokens == greedy_decode(TARGET, prompt, 30, eos_token_id=eos).tokens


@pytest.mark.parametrize("k", [0, 1, 4])
def test_max_new_tokens_one_and_zero(k):
    prompt = [2, 2, 2, 2]
    one = SpecDecoder(TARGET, NgramDrafter(), k=k).generate(prompt, 1)
    assert one.tokens == greedy_decode(TARGET, prompt, 1).tokens and len(one.tokens) == 1
    zero = SpecDecoder(TARGET, NgramDrafter(), k=k).generate(prompt, 0)
    assert zero.tokens == () and zero.stop_reason == "max_new_tokens"
    assert TARGET.processed == len(prompt) - 1


@given(extra=st.integers(0, 6), k=st.integers(0, 8), rollback=st.sampled_from(["checkpoint", "replay"]))
def test_prompts_near_max_context(extra, k, rollback):
    target = small_target()
    n = target.max_context - extra
    prompt = ([5, 6, 7] * 40)[:n]
    gen = SpecDecoder(target, NgramDrafter(), k=k, rollback=rollback).generate(prompt, 20)
    ref = greedy_decode(small_target(), prompt, 20)
    assert gen.tokens == ref.tokens and gen.stop_reason == ref.stop_reason
    assert target.processed <= target.max_context
    assert target.processed == len(prompt) + len(gen.tokens) - 1
    if extra + 1 < 20:
        assert gen.stop_reason == "context_full" and len(gen.tokens) == extra + 1


def test_multi_turn_session_matches_greedy_of_the_whole():
    target = small_target()
    session = SpecDecoder(target, NgramDrafter(), k=4).start([1, 2, 3, 1, 2])
    first = session.generate(10)
    session.extend([4, 4, 4])
    second = session.generate(10)
    whole = [1, 2, 3, 1, 2, *first.tokens, 4, 4, 4]
    assert second.tokens == greedy_decode(small_target(), whole, 10).tokens
    assert target.processed == len(session.context) - 1


# ---- error paths -------------------------------------------------------------------------


def test_prompt_errors_name_the_problem():
    dec = SpecDecoder(TARGET, NgramDrafter())
    with pytest.raises(EmptyPromptError, match="prompt is empty"):
        dec.generate([], 4)
    with pytest.raises(TokenRangeError, match=r"prompt\[1\]=99 is not a token id in \[0, 32\)"):
        dec.generate([1, 99], 4)
    with pytest.raises(TokenRangeError, match=r"prompt\[0\]=True"):
        dec.generate([True], 4)
    with pytest.raises(PromptTooLongError, match="prompt has 97 tokens but the target's max_context is 96"):
        dec.generate([1] * 97, 4)
    with pytest.raises(TokenRangeError, match="eos_token_id=32"):
        dec.generate([1], 4, eos_token_id=32)


def test_setting_errors():
    with pytest.raises(InvalidSettingError, match="SpecDecoder: k=-1 must be an integer >= 0"):
        SpecDecoder(TARGET, NgramDrafter(), k=-1)
    with pytest.raises(InvalidSettingError, match="rollback='undo'"):
        SpecDecoder(TARGET, NgramDrafter(), rollback="undo")  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="max_new_tokens=-3 must be an integer >= 0"):
        SpecDecoder(TARGET, NgramDrafter()).generate([1], -3)


class _Fixed:
    name = "tests.FixedDrafter"

    def __init__(self, draft):
        self.draft = draft

    def propose(self, context, k):
        return self.draft


@pytest.mark.parametrize(
    "draft, message",
    [
        ([1, 2, 3, 4, 5, 6], "proposed 6 tokens but was asked for at most k=4"),
        ([1, 40], r"draft\[1\]=40, not a token id in \[0, 32\)"),
        ([1.0], r"draft\[0\]=1.0"),
        ("ab", "returned str"),
        (None, "returned NoneType"),
    ],
)
def test_bad_drafts_name_the_drafter_and_round(draft, message):
    with pytest.raises(DecodeError, match=message) as info:
        SpecDecoder(TARGET, _Fixed(draft), k=4).generate([1, 2, 3], 8)
    assert isinstance(info.value.__cause__, DrafterContractError)
    assert "tests.FixedDrafter in round 0" in str(info.value)


def test_numpy_drafts_are_accepted():
    prompt = [1, 2, 3, 1, 2]
    ref = greedy_decode(TARGET, prompt, 12)

    class NumpyDrafter:
        def propose(self, context, k):
            return np.asarray(NgramDrafter().propose(list(context), k), dtype=np.int64)

    assert SpecDecoder(TARGET, NumpyDrafter(), k=3).generate(prompt, 12).tokens == ref.tokens


class _FailsAt:
    def __init__(self, when, inner):
        self.when, self.calls, self.inner = when, 0, inner

    def propose(self, context, k):
        self.calls += 1
        if self.calls == self.when:
            raise RuntimeError("drafter exploded")
        return self.inner.propose(context, k)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_drafter_failure_keeps_partial_output_and_restores_target(rollback):
    target = small_target()
    prompt = [4, 5, 6, 4, 5]
    with pytest.raises(DecodeError, match="round 3 failed: drafter exploded") as info:
        SpecDecoder(target, _FailsAt(4, NgramDrafter()), k=3, rollback=rollback).generate(prompt, 30)
    partial = info.value.partial
    assert partial.stop_reason == "error" and len(partial.steps) == 3
    assert partial.tokens == greedy_decode(small_target(), prompt, len(partial.tokens)).tokens
    assert target.processed == len(prompt) + len(partial.tokens) - 1


class _TargetFailsAt(CountingTarget):
    def __init__(self, inner, when):
        super().__init__(inner)
        self.when = when

    def forward_with_checkpoints(self, tokens):
        if self.forwards + 1 == self.when:
            self.inner.forward(tokens[:1])  # half-done work that must be undone
            raise RuntimeError("device lost")
        return super().forward_with_checkpoints(tokens)


def test_target_failure_mid_round_restores_the_round_start():
    inner = small_target()
    target = _TargetFailsAt(inner, when=4)
    prompt = [9, 8, 7, 9, 8]
    with pytest.raises(DecodeError, match="device lost") as info:
        SpecDecoder(target, NgramDrafter(), k=3).generate(prompt, 30)
    partial = info.value.partial
    assert inner.processed == len(prompt) + len(partial.tokens) - 1
