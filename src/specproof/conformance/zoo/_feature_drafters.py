"""Feature drafters and feature engines for the zoo (docs/contract.md, "Feature drafters").

Drafters: a seeded EAGLE-style ``FeatureHead`` over the zoo's small reference model
(``zoo_feature_head``), drafted by ``HeadDrafter``: correct with either head rollback, or
computing its features itself; broken by keeping its draft chain's KV as if accepted.

Engines: ``FeatureZooEngine`` runs the built-in ``SpecDecoder`` over the zoo model through a
feature adapter (``_FeatureAdapter``: the engine's own glue between its target and its
drafter). The control passes the target's features on unchanged; each member breaks the
glue the way engines have: the verify forward's last row taken as the last accepted
position's feature, rows shifted by one position, ``hidden_states`` indexed as if entry 0
were the first block (the wrong layer), a feature cache keyed by position that outlives a
request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specproof.conformance.zoo._targets import ZOO_CONFIG, small_reference
from specproof.contract.errors import InvalidSettingError
from specproof.engine import Generation, NgramDrafter, ReferenceHybrid, SpecDecoder
from specproof.engine.drafters.heads import FeatureHead, HeadDrafter

__all__ = [
    "FeatureLookupDrafter",
    "FeatureZooEngine",
    "HeadKeepsChain",
    "HeadRecomputesFeatures",
    "zoo_feature_head",
    "zoo_feature_target",
]

ZOO_FEATURE_TARGET = "specproof.conformance.zoo._feature_drafters:zoo_feature_target"
HEAD_LAYERS = (0, 1, 3)


def zoo_feature_target() -> ReferenceHybrid:
    """The zoo's small reference model (a ``FeatureTarget``), as a target plug-in spec for feature drafters."""
    return small_reference()


_HEAD: list[FeatureHead] = []


def zoo_feature_head() -> FeatureHead:
    """A seeded EAGLE-style head over the zoo model's embedding (built once)."""
    if not _HEAD:
        d, hd, f = ZOO_CONFIG.d_model, 16, 64
        rng = np.random.default_rng(2024)

        def r(*shape: int, scale: float = 0.3) -> np.ndarray:
            return (rng.standard_normal(shape) * scale).astype(np.float32)

        weights = {
            "fc.weight": r(d, len(HEAD_LAYERS) * d),
            "hidden_norm.weight": np.ones(d, np.float32),
            "embed_norm.weight": np.ones(d, np.float32),
            "in_proj.weight": r(d, 2 * d),
            "block.operator_norm.weight": np.ones(d, np.float32),
            "block.self_attn.q_proj.weight": r(2 * hd, d),
            "block.self_attn.k_proj.weight": r(hd, d),
            "block.self_attn.v_proj.weight": r(hd, d),
            "block.self_attn.out_proj.weight": r(d, 2 * hd),
            "block.self_attn.q_layernorm.weight": np.full(hd, 1.5, np.float32),
            "block.self_attn.k_layernorm.weight": np.full(hd, 1.5, np.float32),
            "block.ffn_norm.weight": np.ones(d, np.float32),
            "block.feed_forward.w1.weight": r(f, d),
            "block.feed_forward.w3.weight": r(f, d),
            "block.feed_forward.w2.weight": r(d, f),
            "norm.weight": np.ones(d, np.float32),
        }
        config = {
            "kind": "eagle",
            "feature_layers": list(HEAD_LAYERS),
            "d_model": d,
            "n_heads": 2,
            "n_kv_heads": 1,
            "head_dim": hd,
            "ffn_dim": f,
            "rope_theta": 10000.0,
            "norm_eps": 1e-5,
            "max_context": ZOO_CONFIG.max_context,
            "vocab_size": ZOO_CONFIG.vocab_size,
        }
        embed = zoo_feature_target().weights["model.embed_tokens.weight"]
        _HEAD.append(FeatureHead(config, weights, embed))
    return _HEAD[0]


def head_drafter(cls: type[HeadDrafter] = HeadDrafter, **kwargs: Any) -> HeadDrafter:
    return cls(
        zoo_feature_head(),
        zoo_feature_target,
        name=f"specproof.zoo.{cls.__name__}({kwargs.get('rollback', 'truncate')})",
        feature_target_spec=ZOO_FEATURE_TARGET,
        **kwargs,
    )


class HeadKeepsChain(HeadDrafter):
    """``drafter.features``: keeps the draft chain's head KV as if accepted (no head rollback after a partial
    accept), so the accepted draft positions keep keys computed from substituted features."""

    def propose(self, context: Sequence[int], k: int, *, features: Mapping[int, np.ndarray] | None = None) -> list[int]:
        draft = super().propose(context, k, features=features)
        if len(draft) > 1:
            # the bug: the chain's positions (computed from the head's own hiddens) count as real ones
            self._n = len(context) - 1 + len(draft) - 1
            self._toks = [*(int(t) for t in context), *draft[:-1]]
        return draft


class HeadRecomputesFeatures(HeadDrafter):
    """Correct, differently: ignores the features it is handed and computes them from the accepted context."""

    def propose(self, context: Sequence[int], k: int, *, features: Mapping[int, np.ndarray] | None = None) -> list[int]:
        return super().propose(context, k)


class FeatureLookupDrafter:
    """The feature engines' own drafter: prompt lookup that declares (and ignores) the zoo model's features."""

    feature_layers = (1, 3)
    feature_target_spec = ZOO_FEATURE_TARGET

    def __init__(self) -> None:
        self.inner = NgramDrafter(min_n=1, max_n=3)
        self.name = "specproof.zoo.FeatureLookupDrafter"

    def reset(self) -> None:
        self.inner.reset()

    def propose(self, context: Sequence[int], k: int, *, features: Mapping[int, np.ndarray] | None = None) -> list[int]:
        return list(self.inner.propose(context, k))


class _FeatureAdapter:
    """The engine's glue: the target ``SpecDecoder`` decodes on (every call passed through to the live
    target) whose ``forward_with_features`` the zoo members break, and the drafter wrapper that hands
    the drafter what the engine stored. The control changes nothing."""

    def __init__(self, engine: FeatureZooEngine) -> None:
        self.engine = engine
        self.inner = engine.target
        self.vocab_size = self.inner.vocab_size
        self.max_context = self.inner.max_context
        self.d_model = self.inner.d_model
        self.feature_layers = self.inner.feature_layers

    @property
    def processed(self) -> int:
        return self.inner.processed

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        return self.inner.forward(tokens)

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[np.ndarray, list[object]]:
        return self.inner.forward_with_checkpoints(tokens)

    def snapshot(self) -> object:
        return self.inner.snapshot()

    def restore(self, snapshot: object) -> None:
        self.inner.restore(snapshot)

    def reset(self) -> None:
        self.inner.reset()

    def state_arrays(self) -> dict[str, np.ndarray]:
        return self.inner.state_arrays()

    def forward_with_features(
        self, tokens: Sequence[int], layers: Sequence[int], *, checkpoints: bool = False
    ) -> tuple[np.ndarray, dict[int, np.ndarray], list[object] | None]:
        return self.engine._features(self.inner, tokens, tuple(layers), checkpoints)


class _Handoff:
    """Wraps the installed drafter: declares its layers; hands it ``engine._handed(context, features)``."""

    def __init__(self, engine: FeatureZooEngine, drafter: Any) -> None:
        self.engine = engine
        self.drafter = drafter
        self.feature_layers = getattr(drafter, "feature_layers", None)
        self.name = getattr(drafter, "name", type(drafter).__name__)

    def reset(self) -> None:
        reset = getattr(self.drafter, "reset", None)
        if callable(reset):
            reset()

    def propose(self, context: Sequence[int], k: int, **kwargs: Any) -> Sequence[int]:
        features = kwargs.get("features")
        if features is None or self.feature_layers is None:
            return self.drafter.propose(context, k)  # type: ignore[no-any-return]
        return self.drafter.propose(context, k, features=self.engine._handed(context, features))  # type: ignore[no-any-return]


class FeatureZooEngine:
    """A correct engine with a feature drafter over the zoo model: ``SpecDecoder`` plus feature glue."""

    bug = "none (the correct control)"

    def __init__(self, *, k: int = 4, rollback: str = "checkpoint") -> None:
        if rollback not in ("checkpoint", "replay"):
            raise InvalidSettingError(f"{type(self).__name__} rollback={rollback!r} is not 'checkpoint' or 'replay'")
        self.target = small_reference()
        self.oracle = small_reference()
        self.vocab_size = self.target.vocab_size
        self.max_context = self.target.max_context
        self.k = k
        self.rollback = rollback
        self.drafter: Any = FeatureLookupDrafter()
        self.name = f"specproof.zoo.{type(self).__name__}(k={k}, rollback={rollback})"
        self._last_rows: dict[int, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"<{self.name}; bug: {self.bug}>"

    def reset(self) -> None:
        self.target.reset()
        self._last_rows = {}

    # ---- the glue (correct here; the members override one of these)

    def _features(
        self, target: ReferenceHybrid, tokens: Sequence[int], layers: tuple[int, ...], checkpoints: bool
    ) -> tuple[np.ndarray, dict[int, np.ndarray], list[object] | None]:
        logits, feats, cks = target.forward_with_features(tokens, layers, checkpoints=checkpoints)
        self._last_rows = {layer: feats[layer][-1] for layer in layers}
        return logits, dict(feats), cks

    def _handed(self, context: Sequence[int], features: Mapping[int, np.ndarray]) -> Mapping[int, np.ndarray]:
        return features

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        drafter = _Handoff(self, self.drafter)
        decoder = SpecDecoder(_FeatureAdapter(self), drafter, k=self.k, rollback=self.rollback)  # type: ignore[arg-type]
        return decoder.generate(prompt, max_new_tokens, eos_token_id=eos_token_id)


def _readonly(rows: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    out = {}
    for layer, arr in rows.items():
        a = np.array(arr)
        a.flags.writeable = False
        out[layer] = a
    return out


class FeatureFromRejected(FeatureZooEngine):
    """``engine.features``: hands the verify forward's last row as the last accepted position's feature, which
    after a partial accept is a rejected draft position's."""

    bug = "the last verify row stands for the last accepted position"

    def _handed(self, context: Sequence[int], features: Mapping[int, np.ndarray]) -> Mapping[int, np.ndarray]:
        out = {layer: np.array(arr) for layer, arr in features.items()}
        for layer, arr in out.items():
            if len(arr) and layer in self._last_rows:
                arr[-1] = self._last_rows[layer]
        return _readonly(out)


class FeaturesShifted(FeatureZooEngine):
    """``engine.features``: hands features shifted by one position against the tokens (row i holds position
    i - 1's feature; row 0 is zeros)."""

    bug = "features shifted by one position"

    def _handed(self, context: Sequence[int], features: Mapping[int, np.ndarray]) -> Mapping[int, np.ndarray]:
        out = {}
        for layer, arr in features.items():
            a = np.zeros_like(np.asarray(arr))
            a[1:] = np.asarray(arr)[:-1]
            out[layer] = a
        return _readonly(out)


class FeaturesWrongLayer(FeatureZooEngine):
    """``engine.features``: reads ``hidden_states[layer]`` as if entry 0 were the first block's output (entry 0
    is the embeddings), so the drafter is handed the block before the one it declared."""

    bug = "the wrong layer fused (off by one block)"

    def _features(
        self, target: ReferenceHybrid, tokens: Sequence[int], layers: tuple[int, ...], checkpoints: bool
    ) -> tuple[np.ndarray, dict[int, np.ndarray], list[object] | None]:
        shifted = tuple(max(layer - 1, 0) for layer in layers)
        logits, feats, cks = target.forward_with_features(tokens, sorted(set(shifted)), checkpoints=checkpoints)
        return logits, {layer: feats[s] for layer, s in zip(layers, shifted, strict=True)}, cks


class FeaturesStaleAcrossRequests(FeatureZooEngine):
    """``engine.features``: caches handed feature rows by position across requests (a prefix cache keyed on the
    length, not the tokens; ``reset()`` keeps it), so a later request reusing a prefix length gets the earlier
    request's features."""

    bug = "stale features after a request reusing a prefix"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cache: dict[int, dict[int, np.ndarray]] = {}

    def reset(self) -> None:
        self.target.reset()  # the bug: the feature cache survives

    def _handed(self, context: Sequence[int], features: Mapping[int, np.ndarray]) -> Mapping[int, np.ndarray]:
        out = {}
        for layer, arr in features.items():
            a = np.array(arr)
            rows = self._cache.setdefault(layer, {})
            for i in range(len(a)):
                if i in rows:
                    a[i] = rows[i]
                else:
                    rows[i] = a[i].copy()
            out[layer] = a
        return _readonly(out)
