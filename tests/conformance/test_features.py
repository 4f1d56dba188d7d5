"""Features in the contract: the reference target's ``forward_with_features``, and ``SpecDecoder``
handing a feature drafter exactly the features of the accepted positions (docs/contract.md,
"Targets" and "Feature drafters")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from specproof.engine import (
    FeatureDrafter,
    FeatureTarget,
    InvalidSettingError,
    NgramDrafter,
    ReferenceConfig,
    ReferenceHybrid,
    SpecDecoder,
    greedy_decode,
)

CFG = ReferenceConfig(d_model=32, layers=("conv", "attn", "gdn", "attn"), max_context=256)


def _target() -> ReferenceHybrid:
    return ReferenceHybrid(CFG)


def test_reference_target_is_a_feature_target_with_one_layer_per_block() -> None:
    t = _target()
    assert isinstance(t, FeatureTarget)
    assert t.feature_layers == (0, 1, 2, 3)
    assert t.d_model == 32


def test_features_are_chunk_invariant_and_the_logits_are_forwards() -> None:
    toks = [(i * 37) % CFG.vocab_size for i in range(23)]
    whole = _target()
    logits, feats, cks = whole.forward_with_features(toks, (0, 2, 3))
    assert cks is None and set(feats) == {0, 2, 3}
    assert np.array_equal(logits, _target().forward(toks))
    parts = _target()
    rows: dict[int, list[np.ndarray]] = {0: [], 2: [], 3: []}
    for chunk in (toks[:5], toks[5:6], toks[6:17], toks[17:]):
        _, f, _ = parts.forward_with_features(chunk, (0, 2, 3))
        for layer in rows:
            rows[layer].append(f[layer])
    for layer in rows:
        assert feats[layer].shape == (23, 32)
        assert np.array_equal(np.concatenate(rows[layer]), feats[layer])  # bit for bit
    # layers differ from each other (a layer index mix-up would be visible)
    assert not np.array_equal(feats[0], feats[3])


def test_features_with_checkpoints_equal_forward_with_checkpoints() -> None:
    toks = [3, 1, 4, 1, 5, 9, 2, 6]
    a, b = _target(), _target()
    logits, _, cks = a.forward_with_features(toks, (1,), checkpoints=True)
    logits2, cks2 = b.forward_with_checkpoints(toks)
    assert np.array_equal(logits, logits2)
    assert cks is not None and len(cks) == len(toks)
    a.restore(cks[3])
    b.restore(cks2[3])
    assert np.array_equal(a.forward([7]), b.forward([7]))


@pytest.mark.parametrize("layers", [(4,), (-1,), (), ("0",), (True,), "01"])
def test_a_bad_layer_is_a_clear_error_and_changes_nothing(layers: object) -> None:
    t = _target()
    t.forward([1, 2, 3])
    with pytest.raises(InvalidSettingError, match="layer"):
        t.forward_with_features([4, 5], layers)  # type: ignore[arg-type]
    assert t.processed == 3


class SpyDrafter:
    """A feature drafter that records what the engine hands it and drafts by prompt lookup."""

    def __init__(self, layers: tuple[int, ...] = (1, 3)) -> None:
        self.feature_layers = layers
        self.inner = NgramDrafter(min_n=1, max_n=3)
        self.calls: list[tuple[list[int], dict[int, np.ndarray]]] = []

    def reset(self) -> None:
        self.calls = []

    def propose(self, context: Sequence[int], k: int, *, features: Mapping[int, np.ndarray] | None = None) -> list[int]:
        assert features is not None
        self.calls.append((list(context), {layer: np.array(v) for layer, v in features.items()}))
        for v in features.values():
            assert not v.flags.writeable
        return list(self.inner.propose(context, k))


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_the_engine_hands_exactly_the_accepted_positions_features(rollback: str) -> None:
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 5, 6]
    spy = SpyDrafter()
    assert isinstance(spy, FeatureDrafter)
    gen = SpecDecoder(_target(), spy, k=4, rollback=rollback).generate(prompt, 40)
    assert list(gen.tokens) == list(greedy_decode(_target(), prompt, 40).tokens)
    assert gen.stats is not None and gen.stats.drafted > gen.stats.accepted  # some partial rounds happened
    assert len(spy.calls) >= 5
    full = [*prompt, *gen.tokens]
    _, want, _ = _target().forward_with_features(full[:-1], (1, 3))
    for ctx, feats in spy.calls:
        assert ctx == full[: len(ctx)]
        for layer in (1, 3):
            assert feats[layer].shape == (len(ctx) - 1, 32)
            assert np.array_equal(feats[layer], want[layer][: len(ctx) - 1])


def test_user_turns_extend_the_features_too() -> None:
    spy = SpyDrafter((0,))
    dec = SpecDecoder(_target(), spy, k=3, rollback="replay")
    session = dec.start([1, 2, 3, 1, 2])
    session.generate(6)
    session.extend([9, 8, 7])
    session.generate(6)
    ctx, feats = spy.calls[-1]
    _, want, _ = _target().forward_with_features(ctx[:-1], (0,))
    assert np.array_equal(feats[0], want[0])


def test_a_feature_drafter_needs_a_feature_target() -> None:
    class Plain:
        vocab_size = 256
        max_context = 64
        processed = 0

        def forward(self, tokens: Sequence[int]) -> np.ndarray:  # pragma: no cover - never called
            raise AssertionError

        def snapshot(self) -> object:  # pragma: no cover
            return None

        def restore(self, s: object) -> None:  # pragma: no cover
            pass

        def reset(self) -> None:  # pragma: no cover
            pass

    with pytest.raises(InvalidSettingError, match="has no forward_with_features"):
        SpecDecoder(Plain(), SpyDrafter(), rollback="replay")  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match=r"needs feature layers \[7\]"):
        SpecDecoder(_target(), SpyDrafter((1, 7)))


def test_hf_features_are_the_reference_features_and_feed_the_heads() -> None:
    pytest.importorskip("torch", reason="needs specproof[hf] (torch not installed)")
    pytest.importorskip("transformers", reason="needs specproof[hf] (transformers not installed)")
    from specproof.plugins import load_drafter, load_target

    reference = load_target("trained:max_context=512")
    hf = load_target("hf:lfm2-trained,max_context=512")
    assert hf.feature_layers == reference.feature_layers and hf.d_model == reference.d_model
    toks = list(b"def read(self, path):\n    with open(path) as f:\n")
    _, want, _ = reference.forward_with_features(toks, (0, 1, 3))
    for start, stop in ((0, 10), (10, len(toks))):
        chunk = toks[start:stop]
        _, got, cks = hf.forward_with_features(chunk, (0, 1, 3), checkpoints=True)
        assert cks is not None and len(cks) == len(chunk)
        for layer in (0, 1, 3):
            assert np.abs(got[layer] - want[layer][start : start + len(chunk)]).max() < 1e-3
    with pytest.raises(InvalidSettingError, match="layers"):
        hf.forward_with_features([1], (9,))
    prompt = toks
    expected = list(greedy_decode(load_target("trained:max_context=512"), prompt, 24).tokens)
    for rollback in ("checkpoint", "replay"):
        gen = SpecDecoder(
            load_target("hf:lfm2-trained,max_context=512"), load_drafter("eagle:trained"), k=4, rollback=rollback
        ).generate(prompt, 24)
        assert list(gen.tokens) == expected
        assert gen.stats is not None and gen.stats.accepted > 0
