"""MLXTarget: the Target protocol on mlx-lm's LFM2 and Qwen3.5, cross-checked against mlx-lm's own greedy decoding."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="the MLX target tests need the mlx extra: pip install 'specproof[mlx]'")
pytest.importorskip("mlx_lm", reason="the MLX target tests need the mlx extra: pip install 'specproof[mlx]'")

import mlx.core as mx
from mlx_lm.generate import generate_step

# the Target-protocol tests (and their fixtures) both framework targets share, run here
from _framework_target_tests import *  # noqa: F403
from _framework_target_tests import REPETITIVE
from specproof.engine import StaleSnapshotError, TargetContractError, greedy_decode
from specproof.engine.targets.mlx import TINY_MODELS, MLXTarget
from specproof.plugins import load_target

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

# MLX's CPU kernels give the same bits for a q-token forward as for q one-token forwards on these
# models (measured: max |diff| 0.0); the shared chunking checks still allow the target's stated
# tolerance, because Metal kernels are not guaranteed to.


@pytest.fixture(scope="module")
def family() -> str:
    return "mlx"


@pytest.fixture(scope="module", params=TINY_MODELS)
def proto(request: pytest.FixtureRequest) -> MLXTarget:
    t = load_target(f"mlx:{request.param}")
    assert isinstance(t, MLXTarget)
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


def test_features_are_the_reference_features_and_feed_the_heads() -> None:
    # the converted trained fixture: layer i of mlx-lm's LFM2 is block i of the reference
    from specproof.engine import InvalidSettingError, SpecDecoder
    from specproof.plugins import load_drafter

    reference = load_target("trained:max_context=512")
    mlx_target = load_target("mlx:lfm2-trained,max_context=512")
    assert mlx_target.feature_layers == reference.feature_layers and mlx_target.d_model == reference.d_model
    toks = list(b"def read(self, path):\n    with open(path) as f:\n")
    _, want, _ = reference.forward_with_features(toks, (0, 1, 3))
    for start, stop in ((0, 10), (10, len(toks))):
        chunk = toks[start:stop]
        logits, got, cks = mlx_target.forward_with_features(chunk, (0, 1, 3))
        assert cks is None and logits.shape == (len(chunk), mlx_target.vocab_size)
        for layer in (0, 1, 3):
            assert np.abs(got[layer] - want[layer][start : start + len(chunk)]).max() < 1e-4
    assert mlx_target.processed == len(toks)
    # the layers are put back: a plain forward afterwards is not captured, and still agrees
    layers = mlx_target._decoder_layers()
    assert all(type(layer).__name__ != "_CapturingLayer" for layer in layers)
    with pytest.raises(InvalidSettingError, match="layers"):
        mlx_target.forward_with_features([1], (9,))
    with pytest.raises(InvalidSettingError, match="checkpoints=True"):
        mlx_target.forward_with_features([1], (0,), checkpoints=True)
    assert mlx_target.processed == len(toks)  # refused before anything changed
    qwen = load_target("mlx:qwen3_5-tiny")  # layers under language_model
    _, feats, _ = qwen.forward_with_features([1, 2, 3], (0, qwen.feature_layers[-1]))
    last = qwen.feature_layers[-1]
    assert {layer: f.shape for layer, f in feats.items()} == {0: (3, qwen.d_model), last: (3, qwen.d_model)}
    expected = list(greedy_decode(load_target("trained:max_context=512"), toks, 24).tokens)
    gen = SpecDecoder(
        load_target("mlx:lfm2-trained,max_context=512"), load_drafter("eagle:trained"), k=4, rollback="replay"
    ).generate(toks, 24)
    assert list(gen.tokens) == expected
    assert gen.stats is not None and gen.stats.accepted > 0
