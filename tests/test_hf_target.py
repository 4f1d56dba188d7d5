"""HFTarget: the Target protocol on transformers' LFM2, Qwen3.5 and Llama, cross-checked against ``model.generate``."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the HF target tests need the hf extra: pip install 'specproof[hf]'")
pytest.importorskip("transformers", reason="the HF target tests need the hf extra: pip install 'specproof[hf]'")

# Tiny models: torch's intra-op threads only add contention on a shared 2-core runner (30x slower here).
torch.set_num_threads(1)

from specproof.engine import (  # noqa: E402
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
from specproof.engine.targets import TARGET_FAMILIES  # noqa: E402
from specproof.engine.targets.convert import save_hf_lfm2, tiny_lfm2_reference  # noqa: E402
from specproof.engine.targets.hf import TINY_MODELS, HFTarget  # noqa: E402

# transformers' kernels are not batch-invariant: a q-token forward differs from q one-token forwards
# by up to ~4e-5 on these float32 models (the chunked vs recurrent delta rule, gemm vs gemv), so the
# chunking checks use the target's tie_tolerance (1e-3); restore is exact (same calls, same state).
REPETITIVE = list(b"the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the")


@pytest.fixture(autouse=True, scope="module")
def _family() -> object:
    before = TARGET_FAMILIES.get("hf")
    register_target_family("hf", "specproof.engine.targets.hf:load_spec")
    yield
    if before is None:
        TARGET_FAMILIES.pop("hf", None)
    else:
        TARGET_FAMILIES["hf"] = before


@pytest.fixture(scope="module", params=TINY_MODELS)
def proto(request: pytest.FixtureRequest) -> HFTarget:
    t = load_target(f"hf:{request.param}")
    assert isinstance(t, HFTarget)
    return t


@pytest.fixture
def target(proto: HFTarget) -> HFTarget:
    t = copy.deepcopy(proto)
    t.reset()
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


@pytest.mark.parametrize("k", [1, 4])
def test_spec_decoder_replay_is_lossless(target: HFTarget, k: int) -> None:
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
def test_oracle_drafts_all_and_partial_acceptance(target: HFTarget, wrong: int | None) -> None:
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


def test_no_checkpoint_rollback(target: HFTarget) -> None:
    assert not hasattr(target, "forward_with_checkpoints")
    with pytest.raises(InvalidSettingError, match="forward_with_checkpoints"):
        SpecDecoder(target, NgramDrafter(), rollback="checkpoint")


def test_chunk_invariance_within_tolerance(target: HFTarget) -> None:
    toks = REPETITIVE[:20]
    whole = target.forward(toks)
    assert whole.dtype == np.float32 and whole.shape == (20, target.vocab_size)
    target.reset()
    single = np.concatenate([target.forward([t]) for t in toks])
    target.reset()
    chunks = np.concatenate([target.forward(toks[:7]), target.forward(toks[7:8]), target.forward(toks[8:])])
    np.testing.assert_allclose(whole, single, rtol=0, atol=target.tie_tolerance)
    np.testing.assert_allclose(chunks, single, rtol=0, atol=target.tie_tolerance)


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


def test_processed_and_restore_to_zero(target: HFTarget) -> None:
    s0 = target.snapshot()
    first = target.forward([1, 2, 3])
    assert target.processed == 3
    target.restore(s0)
    assert target.processed == 0
    np.testing.assert_array_equal(target.forward([1, 2, 3]), first)


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


def test_capacity_and_token_range_change_nothing(proto: HFTarget) -> None:
    t = HFTarget(proto.model, max_context=8, name="small")
    t.forward([1, 2, 3, 4, 5, 6])
    before = t.state_arrays()
    with pytest.raises(CapacityError, match="max_context=8"):
        t.forward([1, 2, 3])
    with pytest.raises(TokenRangeError, match=r"tokens\[1\]=256"):
        t.forward([1, 256])
    with pytest.raises(TokenRangeError):
        t.forward([True])
    with pytest.raises(TokenRangeError):
        t.forward("ab")  # type: ignore[arg-type]
    assert t.processed == 6
    after = t.state_arrays()
    assert set(before) == set(after)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    t.forward([7, 8])
    assert t.processed == 8


def test_encode_decode_and_describe(target: HFTarget) -> None:
    assert target.decode(target.encode("héllo")) == "héllo"
    assert "transformers" in target.describe() and "rollback=replay" in target.describe()


def test_spec_errors_are_clear(tmp_path: object) -> None:
    with pytest.raises(PluginError, match="unknown model"):
        load_target("hf:gpt-huge")
    with pytest.raises(PluginError, match="no such local model directory"):
        load_target("hf:/nonexistent/model/dir")
    with pytest.raises(PluginError, match="unknown override"):
        load_target("hf:lfm2-tiny,colour=3")


def test_seed_override_changes_the_model() -> None:
    a = load_target("hf:lfm2-tiny,seed=1,max_context=64")
    b = load_target("hf:lfm2-tiny")
    assert a.max_context == 64
    assert not np.array_equal(a.forward([1, 2]), b.forward([1, 2]))


def test_local_path_loads_offline(tmp_path: object) -> None:
    path = str(tmp_path) + "/lfm2"
    ref = tiny_lfm2_reference(seed=2, max_context=64)
    save_hf_lfm2(ref, path)
    t = load_target(f"hf:{path}")
    assert isinstance(t, HFTarget) and t.max_context == 64 and t.vocab_size == 256
    np.testing.assert_allclose(t.forward([5, 6, 7]), ref.forward([5, 6, 7]), rtol=0, atol=5e-4)
