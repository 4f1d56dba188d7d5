"""The engine side of feature drafting (docs/contract.md, "Feature drafters").

A feature drafter reads the target's hidden states at the positions the target has
processed. The engine keeps them in a ``FeatureStore``: one growing buffer per layer,
appended with the rows of the positions a round keeps and never with a rejected
position's, and hands the drafter read-only views of exactly ``processed`` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from specproof.contract.errors import InvalidSettingError, SpecproofError
from specproof.engine.conventions import component_name

__all__ = ["FeatureStore", "drafter_feature_layers", "forward_features"]


def drafter_feature_layers(drafter: object, target: object) -> tuple[int, ...] | None:
    """The layers a feature drafter needs, checked against the target; ``None`` for a plain drafter.

    Raises ``InvalidSettingError`` naming the drafter and the target when the target cannot
    provide them (no ``forward_with_features``, or a layer it does not list).
    """
    raw = getattr(drafter, "feature_layers", None)
    if raw is None:
        return None
    try:
        layers = tuple(int(x) for x in raw)
    except (TypeError, ValueError):
        raise InvalidSettingError(
            f"drafter {component_name(drafter)}: feature_layers={raw!r} is not a sequence of layer indices"
        ) from None
    if not layers:
        raise InvalidSettingError(f"drafter {component_name(drafter)}: feature_layers is empty")
    if not callable(getattr(target, "forward_with_features", None)):
        raise InvalidSettingError(
            f"drafter {component_name(drafter)} reads target features (layers {list(layers)}) but target "
            f"{component_name(target)} has no forward_with_features (docs/contract.md, 'Targets')"
        )
    offered = tuple(getattr(target, "feature_layers", ()))
    missing = [x for x in layers if x not in offered]
    if missing:
        raise InvalidSettingError(
            f"drafter {component_name(drafter)} needs feature layers {missing} that target {component_name(target)} "
            f"does not offer (feature_layers={list(offered)})"
        )
    return layers


def forward_features(
    target: object, tokens: Sequence[int], layers: tuple[int, ...], *, checkpoints: bool, what: str
) -> tuple[np.ndarray, dict[int, np.ndarray], list[object] | None]:
    """``target.forward_with_features`` with its feature rows checked (one per token, ``d_model`` wide)."""
    logits, feats, cks = target.forward_with_features(  # type: ignore[attr-defined]
        list(tokens), layers, checkpoints=checkpoints
    )
    out: dict[int, np.ndarray] = {}
    for layer in layers:
        if layer not in feats:
            raise SpecproofError(
                f"target {component_name(target)} returned no feature for layer {layer} in {what} (target.features)"
            )
        arr = np.asarray(feats[layer], dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] != len(tokens):
            raise SpecproofError(
                f"target {component_name(target)} returned features of shape {arr.shape} for layer {layer} in "
                f"{what}; expected [{len(tokens)}, d_model] (target.features)"
            )
        out[layer] = arr
    return logits, out, cks


class FeatureStore:
    """Per-layer rows of the processed positions; ``view()`` hands out read-only ``[n, d]`` slices."""

    def __init__(self, layers: tuple[int, ...]) -> None:
        self.layers = layers
        self._bufs: dict[int, np.ndarray] = {}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def clear(self) -> None:
        self._n = 0

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self._n:
            raise SpecproofError(f"FeatureStore.truncate({n}) with {self._n} rows")
        self._n = n

    def append(self, rows: Mapping[int, np.ndarray], count: int) -> None:
        """Append the first ``count`` rows of each layer's array."""
        if count <= 0:
            return
        need = self._n + count
        for layer in self.layers:
            src = rows[layer][:count]
            buf = self._bufs.get(layer)
            if buf is None or buf.shape[0] < need or buf.shape[1] != src.shape[1]:
                grown = np.zeros((max(need, 2 * (0 if buf is None else buf.shape[0]), 64), src.shape[1]), np.float32)
                if buf is not None and self._n:
                    grown[: self._n] = buf[: self._n]
                self._bufs[layer] = buf = grown
            buf[self._n : need] = src
        self._n = need

    def view(self) -> dict[int, np.ndarray]:
        out = {}
        for layer in self.layers:
            buf = self._bufs.get(layer)
            v = (buf[: self._n] if buf is not None else np.zeros((0, 0), np.float32)).view()
            v.flags.writeable = False
            out[layer] = v
        return out
