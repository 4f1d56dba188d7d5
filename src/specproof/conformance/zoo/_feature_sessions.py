"""Session engines whose drafter reads the target's features: a prefix cache and the hidden states it keeps.

``FeatureSessionEngine`` is the correct control: the ``SessionEngine`` prefix cache (KV and
recurrent-state snapshots, reused across requests) with a feature drafter (the zoo's
``FeatureLookupDrafter`` by default, or whatever the suite installs). Beside the cache it
keeps the feature rows of every cached position (the hidden states the verify and prefill
forwards computed), so a request that reuses a prefix hands the drafter those rows for the
reused positions and fresh ones for the rest. Rows it did not keep (a request before drafted
without features) it recomputes on a side copy of the model, still reusing the KV.

``PrefixHitZeroFeatures`` breaks exactly that, as vLLM #43650 shipped (MTP with prefix
caching on a hybrid model): the prefix cache restores the KV and the recurrent state of
the reused positions but keeps no hidden states, so the drafter is handed zero rows for
every position served from the cache. ``PrefixHitStaleFeatures`` keeps stale rows instead: its
hidden-state buffer only appends, so after an edit or a shorter prefix the re-fed positions
below the buffer's old end keep the previous context's rows. Their tokens stay lossless (verification keeps them
right); only its drafts suffer, and only across requests: every fresh engine is correct.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from specproof.conformance.zoo._feature_drafters import FeatureLookupDrafter
from specproof.conformance.zoo._session_engines import SessionEngine, _common_prefix
from specproof.engine import DecodeSession

__all__ = ["FeatureSessionEngine", "PrefixHitStaleFeatures", "PrefixHitZeroFeatures"]

_CHUNK = 8  # prefill chunk, as the session engines' (a snapshot at every multiple of it)


class _Rows:
    """The engine's feature rows handed to its decode session: what ``DecodeSession`` reads and appends to."""

    def __init__(self, layers: tuple[int, ...], rows: dict[int, np.ndarray]) -> None:
        self.layers = layers
        self._rows = {layer: [np.asarray(rows[layer], dtype=np.float32)] for layer in layers}
        self._n = len(rows[layers[0]])

    def __len__(self) -> int:
        return self._n

    def clear(self) -> None:
        self.truncate(0)

    def truncate(self, n: int) -> None:
        for layer in self.layers:
            self._rows[layer] = [self.rows(layer)[:n]]
        self._n = n

    def append(self, rows: dict[int, np.ndarray], count: int) -> None:
        if count <= 0:
            return
        for layer in self.layers:
            self._rows[layer].append(np.asarray(rows[layer][:count], dtype=np.float32))
        self._n += count

    def rows(self, layer: int) -> np.ndarray:
        parts = self._rows[layer]
        if len(parts) > 1:
            self._rows[layer] = parts = [np.concatenate(parts)]
        return parts[0]

    def view(self) -> dict[int, np.ndarray]:
        out = {}
        for layer in self.layers:
            v = self.rows(layer).view()
            v.flags.writeable = False
            out[layer] = v
        return out


class FeatureSessionEngine(SessionEngine):
    """Correct: a prefix-caching session engine with a feature drafter, keeping its cached positions' rows."""

    bug = "none (the correct control)"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("drafter", FeatureLookupDrafter())
        self._rows: dict[int, np.ndarray] = {}  # layer -> rows of _cached[:self._held]
        self._held = 0
        self._side: Any = None  # a copy of the model that recomputes rows the cache did not keep
        super().__init__(**kwargs)

    def reset(self) -> None:
        super().reset()
        self._rows = {}
        self._held = 0

    def _layers(self) -> tuple[int, ...] | None:
        raw = getattr(self.drafter, "feature_layers", None)
        return None if raw is None else tuple(int(x) for x in raw)

    # ------------------------------------------------------------------ the rows beside the cache

    def _rows_upto(self, start: int, layers: tuple[int, ...]) -> dict[int, np.ndarray]:
        """The rows of the reused positions ``[0, start)``: the kept ones, or (not all kept: the requests
        before drafted without features, or read other layers) recomputed on a side copy of the model."""
        if start == 0:
            return {layer: np.zeros((0, self.target.d_model), np.float32) for layer in layers}
        if start <= self._held and set(layers) <= set(self._rows):
            return {layer: self._rows[layer][:start] for layer in layers}
        if self._side is None:
            self._side = copy.deepcopy(self.target)
        self._side.reset()
        _, feats, _ = self._side.forward_with_features(self._cached[:start], layers)
        return {layer: np.asarray(feats[layer], dtype=np.float32) for layer in layers}

    def _position(self, prompt: list[int]) -> tuple[int, int]:
        layers = self._layers()
        if layers is None:
            forwards, start = super()._position(prompt)
            self._held = min(self._held, start)  # re-fed without features: no rows past the reused prefix
            return forwards, start
        want = prompt[:-1]
        common = _common_prefix(self._cached, want)
        if common == len(self._cached) and self.target.processed == common:
            start = common  # the cache is a prefix of the prompt: feed the rest (multi-turn)
        else:
            start = self._rewind(common)
        kept = self._rows_upto(start, layers)
        forwards, fresh = self._feed_features(want[start:], layers)
        self._rows = self._merged(kept, fresh, layers)
        self._held = len(want)
        self._cached = list(want)
        self._snap()
        return forwards, start

    def _merged(
        self, kept: dict[int, np.ndarray], fresh: dict[int, np.ndarray], layers: tuple[int, ...]
    ) -> dict[int, np.ndarray]:
        """The rows of ``prompt[:-1]``: the reused positions' then the fed ones'."""
        return {layer: np.concatenate([kept[layer], fresh[layer]]) for layer in layers}

    def _feed_features(self, tokens: Sequence[int], layers: tuple[int, ...]) -> tuple[int, dict[int, np.ndarray]]:
        """``_feed`` through ``forward_with_features``: the forwards used and the fed positions' rows."""
        forwards = 0
        parts: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
        pos = self.target.processed
        i = 0
        while i < len(tokens):
            stop = min(len(tokens), i + _CHUNK - (pos + i) % _CHUNK)
            _, feats, _ = self.target.forward_with_features(list(tokens[i:stop]), layers)
            for layer in layers:
                parts[layer].append(np.asarray(feats[layer], dtype=np.float32))
            forwards += 1
            i = stop
            if self.target.processed % _CHUNK == 0:
                self._snap()
        width = self.target.d_model
        return forwards, {
            layer: np.concatenate(parts[layer]) if parts[layer] else np.zeros((0, width), np.float32)
            for layer in layers
        }

    def _session(self, ctx: list[int], forwards: int) -> DecodeSession:
        session = super()._session(ctx, forwards)
        layers = self._layers()
        if layers is not None:  # hand the decode session the rows of ctx[:-1]; it appends the kept ones
            n = len(ctx) - 1
            session._features = _Rows(layers, {layer: self._rows[layer][:n] for layer in layers})  # type: ignore[assignment]
        return session

    def _finished(self, session: DecodeSession) -> None:
        store = session._features
        if store is None:
            self._held = min(self._held, len(self._cached))
            return
        self._rows = {layer: np.array(rows) for layer, rows in store.view().items()}
        self._held = len(store)


class PrefixHitZeroFeatures(FeatureSessionEngine):
    """``engine.session``: on a prefix hit the cache restores KV and recurrent state but no hidden states, so
    the feature drafter is handed zero rows for every position served from the cache."""

    bug = "a prefix hit hands the feature drafter zero rows for the cached positions (no hidden states kept)"

    def _rows_upto(self, start: int, layers: tuple[int, ...]) -> dict[int, np.ndarray]:
        width = self.target.d_model
        return {layer: np.zeros((start, width), np.float32) for layer in layers}


class PrefixHitStaleFeatures(FeatureSessionEngine):
    """``engine.session``: the hidden-state buffer only appends: a prefix hit shorter than the cache re-feeds the
    rest, but the rows of positions below the buffer's old end keep the previous context's features."""

    bug = "a prefix hit keeps the previous context's feature rows for the positions it re-feeds (stale rows)"

    def _merged(
        self, kept: dict[int, np.ndarray], fresh: dict[int, np.ndarray], layers: tuple[int, ...]
    ) -> dict[int, np.ndarray]:
        rows = super()._merged(kept, fresh, layers)
        if not set(layers) <= set(self._rows):
            return rows
        for layer in layers:
            old = self._rows[layer]
            upto = min(len(old), len(rows[layer]), self._held)
            rows[layer][:upto] = old[:upto]  # the bug: rows below the old end are never overwritten
        return rows
