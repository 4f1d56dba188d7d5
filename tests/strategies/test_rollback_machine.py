"""RollbackMachine: passes on the correct SpecDecoder with both rollbacks, takes every round path,
and fails, naming the right invariant, on deliberately broken decoders and targets."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument

from _targets import small_target
from specproof.engine import DecodeSession, InvalidSettingError, SpecDecoder
from specproof.strategies import RollbackMachine, RollbackMachineFailure, run_rollback_machine
from specproof.strategies._machine import PROPERTIES

# Finding a bug needs only generation; skipping the shrink and explain phases keeps these tests
# to seconds (the message checked is the first failure's, which names the same invariant).
# finding a planted bug is a claim about fixed examples: derandomized, or the random dev profile misses some
FIND_ONLY = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    stateful_step_count=25,
    phases=[Phase.generate],
    database=None,
)

PATHS = {"round:all_accepted", "round:rejected_at_0", "round:partial", "round:empty_draft", "round:clamped_draft"}


# --------------------------------------------------------------------------- broken implementations


class ForgetfulRestore:
    """Wraps a ReferenceHybrid; ``restore`` puts back ``processed`` but keeps the current conv/rec state.

    The LFM2 bug class: cache cropping that ignores the recurrent state. Rounds that
    reject a draft token leave the state of the rejected tokens behind.
    """

    def __init__(self, inner):
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.max_context = inner.max_context

    @property
    def processed(self):
        return self.inner.processed

    def forward(self, tokens):
        return self.inner.forward(tokens)

    def forward_with_checkpoints(self, tokens):
        return self.inner.forward_with_checkpoints(tokens)

    def snapshot(self):
        return self.inner.snapshot()

    def restore(self, snap):
        now = self.inner.snapshot()
        self.inner.restore(attrs.evolve(snap, conv_state=now.conv_state, rec_state=now.rec_state))

    def reset(self):
        self.inner.reset()


class Opaque:
    """A black-box view of a target: no ``state_arrays``, so the machine must observe through logits."""

    def __init__(self, inner=None):
        self.inner = small_target() if inner is None else inner
        self.vocab_size = self.inner.vocab_size
        self.max_context = self.inner.max_context

    @property
    def processed(self):
        return self.inner.processed

    def forward(self, tokens):
        return self.inner.forward(tokens)

    def forward_with_checkpoints(self, tokens):
        return self.inner.forward_with_checkpoints(tokens)

    def snapshot(self):
        return self.inner.snapshot()

    def restore(self, snap):
        self.inner.restore(snap)

    def reset(self):
        self.inner.reset()


class BatchVariantBonus(Opaque):
    """Verify forwards (q > 1) nudge the last row toward id 0: a kernel that is not batch-invariant.

    Rounds whose draft is fully accepted emit the nudged argmax as the bonus token.
    """

    def _nudge(self, logits):
        logits = np.array(logits, copy=True)
        if len(logits) > 1:
            logits[-1, 0] = logits[-1].max() + 1.0
        return logits

    def forward(self, tokens):
        return self._nudge(self.inner.forward(tokens))

    def forward_with_checkpoints(self, tokens):
        logits, checkpoints = self.inner.forward_with_checkpoints(tokens)
        return self._nudge(logits), checkpoints


class LazyExtendSession(DecodeSession):
    """A session whose user turns are appended to the context but never fed to the target."""

    def extend(self, tokens):
        self._ctx.extend(int(t) for t in tokens)


class LazyExtendDecoder(SpecDecoder):
    def start(self, prompt):
        return LazyExtendSession(self, prompt)


def forgetful_decoder(target, drafter, k, rollback):
    return SpecDecoder(ForgetfulRestore(target), drafter, k=k, rollback=rollback)


def batch_variant_decoder(target, drafter, k, rollback):
    return SpecDecoder(BatchVariantBonus(target), drafter, k=k, rollback=rollback)


def lazy_extend_decoder(target, drafter, k, rollback):
    return LazyExtendDecoder(target, drafter, k=k, rollback=rollback)


def forgetful_target():
    return ForgetfulRestore(small_target())


# --------------------------------------------------------------------------- the correct engine passes


CheckpointMachine = RollbackMachine.configure(
    target_factory=small_target, max_k=6, rollbacks=("checkpoint",), stateful_step_count=15
)
# pytest collects this unittest.TestCase: the documented way to run a configured machine
TestCheckpointRollbackMachine = CheckpointMachine.TestCase


def test_spec_decoder_passes_and_every_round_path_is_taken():
    machine = run_rollback_machine(target_factory=small_target, max_k=6)  # rollback drawn per conversation
    seen = machine.observed_paths
    assert PATHS <= set(seen), dict(seen)
    assert seen["rollback:checkpoint"] and seen["rollback:replay"], dict(seen)
    assert seen["prompt:near_max_context"] and seen["user_turn"], dict(seen)


def test_black_box_targets_are_checked_through_logits():
    # Opaque has no state_arrays: engine.state-restored is observed with probe forwards
    quick = settings(deadline=None, max_examples=8, stateful_step_count=15, phases=[Phase.generate, Phase.shrink])
    machine = run_rollback_machine(target_factory=Opaque, max_k=4, settings=quick)
    assert {"round:partial", "round:rejected_at_0"} & set(machine.observed_paths)


# --------------------------------------------------------------------------- broken engines fail


@pytest.mark.parametrize(
    ("factories", "invariant"),
    [
        # white box: the conv_state/rec_state arrays differ from the reference's
        (dict(target_factory=small_target, decoder_factory=forgetful_decoder), "state"),
        # black box: the pending token's logits differ
        (dict(target_factory=Opaque, decoder_factory=forgetful_decoder), "state"),
        # a broken target's own snapshot/restore round trip
        (
            dict(target_factory=forgetful_target, reference_factory=small_target),
            r"(restore|state)",
        ),
        (dict(target_factory=small_target, decoder_factory=batch_variant_decoder), "lossless"),
        (dict(target_factory=small_target, decoder_factory=lazy_extend_decoder), "kv-length"),
    ],
    ids=["forgetful-white-box", "forgetful-black-box", "forgetful-target", "batch-variant-bonus", "lazy-extend"],
)
def test_broken_implementations_fail_naming_the_property(factories, invariant):
    with pytest.raises(RollbackMachineFailure, match=rf"^\[{invariant}\]") as info:
        run_rollback_machine(max_k=6, settings=FIND_ONLY, **factories)
    message = str(info.value)
    assert "after rule " in message and info.value.prop in PROPERTIES
    if message.startswith("[state]") and factories["target_factory"] is small_target:
        assert "differs at (" in message and "max abs diff" in message
        assert "conv_state" in message or "rec_state" in message


def test_state_message_names_the_array_and_the_difference():
    with pytest.raises(AssertionError) as info:
        run_rollback_machine(target_factory=small_target, decoder_factory=forgetful_decoder, settings=FIND_ONLY)
    first_line = str(info.value).splitlines()[0]
    assert first_line.startswith("[state] after rule ")
    assert any(f"after rule {rule}(" in first_line for rule in ("spec_round", "snapshot_round_trip", "sampled_round"))
    assert "max abs diff" in first_line and "atol 0" in first_line


# --------------------------------------------------------------------------- configuration errors


def test_the_base_machine_must_be_configured():
    with pytest.raises(InvalidSettingError, match=r"RollbackMachine.configure\(target_factory=...\)"):
        RollbackMachine()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(target_factory=3), "target_factory=3 must be callable"),
        (dict(target_factory=small_target, max_k=-1), "max_k=-1"),
        (dict(target_factory=small_target, tolerance=-0.5), "tolerance=-0.5"),
        (dict(target_factory=small_target, tolerance=float("nan")), "tolerance=nan"),
        (dict(target_factory=small_target, rollbacks=("rewind",)), "non-empty subset"),
        (dict(target_factory=small_target, rollbacks="replay"), "not a string"),
        (dict(target_factory=small_target, stateful_step_count=0), "stateful_step_count=0"),
        (dict(target_factory=small_target, context_kinds=["prose"]), "unknown kind 'prose'"),
    ],
)
def test_configure_rejects_bad_options(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        RollbackMachine.configure(**kwargs)


def test_a_shared_target_instance_is_refused():
    shared = small_target()
    machine = RollbackMachine.configure(target_factory=lambda: shared)
    with pytest.raises(InvalidSettingError, match="three independent instances"):
        machine()


def test_checkpoint_rollback_needs_checkpoints():
    class NoCheckpoints(Opaque):
        forward_with_checkpoints = None

    machine = RollbackMachine.configure(target_factory=NoCheckpoints, rollbacks=("checkpoint",))
    with pytest.raises(InvalidSettingError, match="no forward_with_checkpoints"):
        machine()


class NoisyStates(Opaque):
    """Reports its conv_state 1e-6 off: an export whose state is right within a tolerance only."""

    def state_arrays(self):
        arrays = dict(self.inner.state_arrays())
        arrays["conv_state"] = arrays["conv_state"] + np.float32(1e-6)
        return arrays


def test_tolerance_decides_between_bitwise_and_close():
    quick = settings(FIND_ONLY, max_examples=5, stateful_step_count=10)
    with pytest.raises(AssertionError, match=r"^\[state\].*conv_state differs.*atol 0"):
        run_rollback_machine(target_factory=NoisyStates, reference_factory=small_target, settings=quick)
    run_rollback_machine(target_factory=NoisyStates, reference_factory=small_target, tolerance=1e-4, settings=quick)


# --------------------------------------------------------------------------- the judge shares nothing with the decoder


def _drops_bonus_on_full_accept(monkeypatch):
    """Break the decoder's own accept helper: on a full accept it returns len(draft) - 1, so the
    round emits the draft without the target's bonus token (still the right tokens, one fewer)."""
    from specproof.engine import _decoder

    original = _decoder.longest_accepted_prefix

    def broken(draft, argmax):
        j = original(draft, argmax)
        return j - 1 if draft and j == len(draft) else j

    monkeypatch.setattr(_decoder, "longest_accepted_prefix", broken)


def test_a_decoder_dropping_the_bonus_on_a_full_accept_fails_the_machine(monkeypatch):
    _drops_bonus_on_full_accept(monkeypatch)
    with pytest.raises(RollbackMachineFailure) as info:
        run_rollback_machine(target_factory=small_target, max_k=4, settings=FIND_ONLY)
    assert info.value.prop in ("lossless", "step-record"), str(info.value)


@pytest.mark.slow
def test_certify_rejects_a_decoder_dropping_the_bonus_on_a_full_accept(monkeypatch):
    from specproof.conformance import certify

    passing = certify("target", target="reference", profile="quick", only=("stateful.rollback-machine",))
    assert passing.verdict == "pass", passing.results  # the accepting case: the decoder as shipped
    _drops_bonus_on_full_accept(monkeypatch)
    report = certify("target", target="reference", profile="quick", only=("stateful.rollback-machine",))
    (result,) = report.results
    assert result["status"] == "fail", result
    assert result["violations"][0]["invariant"] == "stateful.rollback-machine"
