"""HFTarget: the Target protocol on transformers' LFM2, Qwen3.5 and Llama, cross-checked against ``model.generate``."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the HF target tests need the hf extra: pip install 'specproof[hf]'")
pytest.importorskip("transformers", reason="the HF target tests need the hf extra: pip install 'specproof[hf]'")

# Tiny models: torch's intra-op threads only add contention on a shared 2-core runner (30x slower here).
torch.set_num_threads(1)

# the Target-protocol tests (and their fixtures) both framework targets share, run here
from _framework_target_tests import *  # noqa: F403, E402
from _framework_target_tests import REPETITIVE  # noqa: E402
from specproof.engine import StaleSnapshotError, TargetContractError, greedy_decode  # noqa: E402
from specproof.engine.targets.hf import TINY_MODELS, HFTarget, load_spec  # noqa: E402
from specproof.plugins import load_target  # noqa: E402

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

# transformers' kernels are not batch-invariant: a q-token forward differs from q one-token forwards
# by up to ~4e-5 on these float32 models (the chunked vs recurrent delta rule, gemm vs gemv), so the
# chunking checks use the target's tie_tolerance (1e-3); restore is exact (same calls, same state).


@pytest.fixture(scope="module")
def family() -> str:
    return "hf"


@pytest.fixture(scope="module", params=TINY_MODELS)
def proto(request: pytest.FixtureRequest) -> HFTarget:
    t = load_target(f"hf:{request.param}")
    assert isinstance(t, HFTarget)
    return t


def hf_greedy(model: object, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy generation: ``model.generate(do_sample=False)``."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)  # type: ignore[attr-defined]
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.mark.parametrize("prompt", [REPETITIVE, list(b"hello"), [7]])
def test_greedy_equals_model_generate(target: HFTarget, prompt: list[int]) -> None:
    ours = greedy_decode(target, prompt, 24).tokens
    assert list(ours) == hf_greedy(target.model, prompt, 24)


def test_restore_equals_fresh_and_snapshot_arrays_are_unchanged(target: HFTarget, proto: HFTarget) -> None:
    prefix, detour, probe = REPETITIVE[:10], REPETITIVE[10:16], REPETITIVE[20:24]
    target.forward(prefix)
    snap = target.snapshot()
    kept = [
        None
        if s is None
        else {k: {i: None if a is None else a.numpy().copy() for i, a in s[k].items()} for k in ("conv", "rec")}
        for s in snap.states
    ]
    target.forward(detour)
    # transformers writes conv / recurrent states in place (copy_): the snapshot's clones must not follow
    for layer_state, saved in zip(snap.states, kept):
        if layer_state is not None:
            for key in ("conv", "rec"):
                for idx, arr in layer_state[key].items():
                    if arr is not None:
                        np.testing.assert_array_equal(arr.numpy(), saved[key][idx])
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


def test_stale_and_foreign_snapshots_are_refused(target: HFTarget) -> None:
    target.forward([1, 2, 3, 4])
    snap4 = target.snapshot()
    other = copy.deepcopy(target)
    with pytest.raises(TargetContractError, match="another target"):
        other.restore(snap4)
    target.forward([5])
    snap5 = target.snapshot()
    target.restore(snap4)
    # unlike the reference and MLX targets, transformers' DynamicLayer.crop drops the cropped slots:
    # a snapshot above the current KV length can never be restored
    with pytest.raises(StaleSnapshotError, match="cropped to 4 tokens"):
        target.restore(snap5)
    target.forward([6])  # rewrites KV slot 4
    with pytest.raises(StaleSnapshotError, match="KV slot 4"):
        target.restore(snap5)
    target.restore(snap4)  # slots 0..3 are untouched: still valid
    assert target.processed == 4
    with pytest.raises(TargetContractError):
        target.restore(object())


def test_lfm2_has_checkpoints_and_gated_deltanet_does_not() -> None:
    """LFM2's conv window after each position is in the verify forward; a delta-rule state is not."""
    assert callable(getattr(load_spec("lfm2-tiny"), "forward_with_checkpoints", None))
    assert not hasattr(load_spec("qwen3_5-tiny"), "forward_with_checkpoints")
    assert "rollback=checkpoint" in load_spec("lfm2-tiny").describe()
