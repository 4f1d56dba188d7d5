"""MLXTarget: the Target protocol on mlx-lm's LFM2 and Qwen3.5, cross-checked against mlx-lm's own greedy decoding."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="the MLX target tests need the mlx extra: pip install 'specproof[mlx]'")
pytest.importorskip("mlx_lm", reason="the MLX target tests need the mlx extra: pip install 'specproof[mlx]'")

import mlx.core as mx
from mlx_lm.generate import generate_step

from specproof.engine import (
    CapacityError,
    InvalidSettingError,
    NgramDrafter,
    PluginError,
    SpecDecoder,
    StaleSnapshotError,
    TargetContractError,
    TokenRangeError,
    greedy_decode,
    load_target,
    register_target_family,
)
from specproof.engine.targets import TARGET_FAMILIES
from specproof.engine.targets.convert import save_mlx_lfm2, tiny_lfm2_reference
from specproof.engine.targets.mlx import TINY_MODELS, MLXTarget

# MLX's CPU kernels give the same bits for a q-token forward as for q one-token forwards on these
# models (measured: max |diff| 0.0); the protocol checks below still allow the target's stated
# tolerance, because Metal kernels are not guaranteed to.
REPETITIVE = list(b"the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the")


@pytest.fixture(autouse=True, scope="module")
def _family() -> object:
    before = TARGET_FAMILIES.get("mlx")
    register_target_family("mlx", "specproof.engine.targets.mlx:load_spec")
    yield
    if before is None:
        TARGET_FAMILIES.pop("mlx", None)
    else:
        TARGET_FAMILIES["mlx"] = before


@pytest.fixture(scope="module", params=TINY_MODELS)
def proto(request: pytest.FixtureRequest) -> MLXTarget:
    t = load_target(f"mlx:{request.param}")
    assert isinstance(t, MLXTarget)
    return t


@pytest.fixture
def target(proto: MLXTarget) -> MLXTarget:
    t = copy.deepcopy(proto)
    t.reset()
    return t


def mlx_lm_greedy(model: object, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy generation (``generate_step`` with its default argmax sampler)."""
    out = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=n):
        out.append(int(tok))
    return out


@pytest.mark.parametrize("prompt", [REPETITIVE, list(b"hello"), [7]])
def test_greedy_equals_mlx_lm_generate(target: MLXTarget, prompt: list[int]) -> None:
    ours = greedy_decode(target, prompt, 24).tokens
    assert list(ours) == mlx_lm_greedy(target.model, prompt, 24)


@pytest.mark.parametrize("k", [1, 4])
def test_spec_decoder_replay_is_lossless(target: MLXTarget, k: int) -> None:
    prompts = [REPETITIVE, list(b"abcabcabcabcab"), list(b"zq")]
    for prompt in prompts:
        expected = greedy_decode(target, prompt, 40).tokens
        gen = SpecDecoder(target, NgramDrafter(), k=k, rollback="replay").generate(prompt, 40)
        assert gen.tokens == expected, f"prompt {bytes(prompt)!r}"
        assert target.processed == len(prompt) + 40 - 1


class OracleDrafter:
    """Proposes the known greedy continuation, with ``draft[wrong]`` corrupted: drives the all-accepted
    (``wrong=None``) and the partially-accepted rollback paths on purpose."""

    def __init__(self, prompt: list[int], continuation: tuple[int, ...], vocab: int, wrong: int | None) -> None:
        self.full = [*prompt, *continuation]
        self.vocab = vocab
        self.wrong = wrong

    def propose(self, context: object, k: int) -> list[int]:
        n = len(context)  # type: ignore[arg-type]
        draft = self.full[n : n + k]
        if self.wrong is not None and len(draft) > self.wrong:
            draft[self.wrong] = (draft[self.wrong] + 1) % self.vocab
        return draft


@pytest.mark.parametrize("wrong", [None, 0, 2])
def test_oracle_drafts_all_and_partial_acceptance(target: MLXTarget, wrong: int | None) -> None:
    prompt = REPETITIVE[:12]
    expected = greedy_decode(target, prompt, 30).tokens
    drafter = OracleDrafter(prompt, expected, target.vocab_size, wrong)
    gen = SpecDecoder(target, drafter, k=4, rollback="replay").generate(prompt, 30)
    assert gen.tokens == expected
    assert gen.stats is not None
    if wrong is None:
        assert gen.stats.accepted == gen.stats.drafted and gen.stats.replay_forwards == 0
        assert gen.stats.mean_tokens_per_round == 5.0
    else:
        assert gen.steps is not None
        rejecting = [s for s in gen.steps if len(s.draft) > wrong]
        assert rejecting and all(len(s.accepted) == wrong + 1 for s in rejecting)
        assert gen.stats.replay_forwards >= len(rejecting)  # each of those rounds rolled back


def test_no_checkpoint_rollback(target: MLXTarget) -> None:
    assert not hasattr(target, "forward_with_checkpoints")
    with pytest.raises(InvalidSettingError, match="forward_with_checkpoints"):
        SpecDecoder(target, NgramDrafter(), rollback="checkpoint")


def test_chunk_invariance_within_tolerance(target: MLXTarget) -> None:
    toks = REPETITIVE[:20]
    whole = target.forward(toks)
    assert whole.dtype == np.float32 and whole.shape == (20, target.vocab_size)
    target.reset()
    single = np.concatenate([target.forward([t]) for t in toks])
    target.reset()
    chunks = np.concatenate([target.forward(toks[:7]), target.forward(toks[7:8]), target.forward(toks[8:])])
    np.testing.assert_allclose(whole, single, rtol=0, atol=target.tie_tolerance)
    np.testing.assert_allclose(chunks, single, rtol=0, atol=target.tie_tolerance)


def test_restore_equals_fresh_and_snapshot_arrays_are_unchanged(target: MLXTarget, proto: MLXTarget) -> None:
    prefix, detour, probe = REPETITIVE[:10], REPETITIVE[10:16], REPETITIVE[20:24]
    target.forward(prefix)
    snap = target.snapshot()
    kept = [None if s is None else [None if a is None else np.array(a) for a in s[0]] for s in snap.states]
    target.forward(detour)
    # mlx-lm rebinds cache[i] instead of writing into the kept arrays: the references still hold the old state
    for layer_state, saved in zip(snap.states, kept):
        if layer_state is not None:
            for arr, old in zip(layer_state[0], saved):
                if arr is not None:
                    np.testing.assert_array_equal(np.array(arr), old)
    target.restore(snap)
    assert target.processed == len(prefix)
    after = target.forward(probe)
    fresh = copy.deepcopy(proto)
    fresh.reset()
    fresh.forward(prefix)
    np.testing.assert_array_equal(after, fresh.forward(probe))
    assert set(target.state_arrays()) == set(fresh.state_arrays())
    for name, arr in fresh.state_arrays().items():
        np.testing.assert_array_equal(target.state_arrays()[name], arr, err_msg=name)


def test_processed_and_restore_to_zero(target: MLXTarget) -> None:
    s0 = target.snapshot()
    first = target.forward([1, 2, 3])
    assert target.processed == 3
    target.restore(s0)
    assert target.processed == 0
    np.testing.assert_array_equal(target.forward([1, 2, 3]), first)


def test_stale_and_foreign_snapshots_are_refused(target: MLXTarget) -> None:
    target.forward([1, 2, 3, 4])
    snap4 = target.snapshot()
    other = copy.deepcopy(target)
    with pytest.raises(TargetContractError, match="another target"):
        other.restore(snap4)
    target.forward([5])
    snap5 = target.snapshot()
    target.restore(snap4)
    target.restore(snap5)  # nothing was written since: going forward again is fine
    target.restore(snap4)
    target.forward([6])  # rewrites KV slot 4
    with pytest.raises(StaleSnapshotError, match="KV slot 4"):
        target.restore(snap5)
    target.restore(snap4)  # slots 0..3 are untouched: still valid
    assert target.processed == 4
    with pytest.raises(TargetContractError):
        target.restore(object())


def test_capacity_and_token_range_change_nothing(proto: MLXTarget) -> None:
    t = MLXTarget(proto.model, max_context=8, name="small")
    t.forward([1, 2, 3, 4, 5, 6])
    before = t.state_arrays()
    with pytest.raises(CapacityError, match="max_context=8"):
        t.forward([1, 2, 3])
    with pytest.raises(TokenRangeError, match=r"tokens\[1\]=256"):
        t.forward([1, 256])
    with pytest.raises(TokenRangeError):
        t.forward([True])
    assert t.processed == 6
    after = t.state_arrays()
    assert set(before) == set(after)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    t.forward([7, 8])
    assert t.processed == 8


def test_encode_decode_and_describe(target: MLXTarget) -> None:
    assert target.decode(target.encode("héllo")) == "héllo"
    assert "mlx-lm" in target.describe() and "rollback=replay" in target.describe()


def test_spec_errors_are_clear(tmp_path: object) -> None:
    with pytest.raises(PluginError, match="unknown model"):
        load_target("mlx:gpt-huge")
    with pytest.raises(PluginError, match="no such local model directory"):
        load_target("mlx:/nonexistent/model/dir")
    with pytest.raises(PluginError, match="unknown override"):
        load_target("mlx:lfm2-tiny,colour=3")


def test_seed_override_changes_the_model() -> None:
    a = load_target("mlx:lfm2-tiny,seed=1,max_context=64")
    b = load_target("mlx:lfm2-tiny")
    assert a.max_context == 64
    assert not np.array_equal(a.forward([1, 2]), b.forward([1, 2]))


def test_local_path_loads_offline(tmp_path: object) -> None:
    path = str(tmp_path) + "/lfm2"
    ref = tiny_lfm2_reference(seed=2, max_context=64)
    save_mlx_lfm2(ref, path)
    t = load_target(f"mlx:{path}")
    assert isinstance(t, MLXTarget) and t.max_context == 64 and t.vocab_size == 256
    np.testing.assert_allclose(t.forward([5, 6, 7]), ref.forward([5, 6, 7]), rtol=0, atol=5e-4)
