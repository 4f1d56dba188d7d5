"""Feature heads: EAGLE-3-style and MTP-style drafters that read the target's hidden states.

docs/contract.md, "Feature drafters". A head position ``i`` takes the target's features at
context position ``i`` (the residual stream after the blocks in ``feature_layers``; an
EAGLE-3 head fuses several depths with a linear layer, an MTP head reads the last block's
output as is) and the embedding of the token at ``i + 1``, runs one attention block with
its own KV cache and rotary positions, and predicts the token at ``i + 2`` through the
target's tied LM head. Drafting a second token feeds the head's own output hidden state
back in place of the feature of the drafted position (the target has not computed it).

The head's KV cache is append-only, like the target's: after a round the drafter keeps
the positions whose tokens and features are accepted and overwrites the rest (the draft
chain's positions, computed with substituted features) at the next call — the head's own
rollback. ``rollback="replay"`` instead snapshots the chain's cache slots before drafting
and puts them back after (as a replay engine does with its target; correct too, more copying).

Every kernel treats each row on its own (the reference target's kernels), so a head fed
one position at a time computes bit for bit what it computes fed in one batch: a drafter
called along a decoding proposes exactly what a fresh one does.

Sampling (``propose_sampled``, docs/contract.md "Sampling"): each draft token, the first and
every chained one, is drawn with the request's generator from the processed distribution of
the head's logits row at the request's parameters, and that row is the token's ``q``. The chain
feeds the sampled token back as it feeds the argmax when greedy, and the head's rollback only
compares tokens, so a fresh drafter with a generator in the same state proposes the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from specproof.contract import Target
from specproof.contract.errors import DrafterContractError, InvalidSettingError
from specproof.contract.sampling import SampledDraft, SamplingParams
from specproof.engine.drafters._pick import Pick, argmax_pick, sampled_draft, sampling_pick
from specproof.engine.targets.reference import _linear, _rms_norm, _silu

__all__ = ["FeatureHead", "HeadDrafter"]

_F32 = np.float32
HEAD_KINDS = ("eagle", "mtp")


class FeatureHead:
    """The numpy head (the function ``scripts/train_heads.py``'s torch ``Head`` computes, same weight names).

    ``embed`` is the target's embedding matrix ``[vocab, d_model]``: the token embedding and,
    tied, the LM head.
    """

    def __init__(self, config: Mapping[str, Any], weights: Mapping[str, np.ndarray], embed: np.ndarray) -> None:
        kind = config.get("kind")
        if kind not in HEAD_KINDS:
            raise InvalidSettingError(f"FeatureHead: kind={kind!r} is not one of {HEAD_KINDS}")
        self.kind: str = str(kind)
        self.feature_layers: tuple[int, ...] = tuple(int(x) for x in config["feature_layers"])
        d = self.d_model = int(config["d_model"])
        self.n_heads, self.n_kv, self.hd = int(config["n_heads"]), int(config["n_kv_heads"]), int(config["head_dim"])
        self.max_context = int(config["max_context"])
        self.eps = float(config["norm_eps"])
        emb = np.ascontiguousarray(embed, dtype=_F32)
        if emb.ndim != 2 or emb.shape[1] != d:
            raise InvalidSettingError(
                f"FeatureHead: the target's embedding has shape {emb.shape}, expected [vocab, {d}]"
            )
        self.vocab_size = int(emb.shape[0])

        def w(name: str, shape: tuple[int, ...]) -> np.ndarray:
            if name not in weights:
                raise InvalidSettingError(f"FeatureHead ({self.kind}): weight {name!r} is missing")
            arr = np.ascontiguousarray(weights[name], dtype=_F32)
            if arr.shape != shape:
                raise InvalidSettingError(
                    f"FeatureHead ({self.kind}): weight {name!r} has shape {arr.shape}, expected {shape}"
                )
            return arr

        nf = len(self.feature_layers)
        self.fc_t = np.ascontiguousarray(w("fc.weight", (d, nf * d)).T) if self.kind == "eagle" else None
        if self.kind == "mtp" and nf != 1:
            raise InvalidSettingError(f"FeatureHead (mtp): reads one feature layer, got {list(self.feature_layers)}")
        self.hidden_norm = w("hidden_norm.weight", (d,))
        self.embed_norm = w("embed_norm.weight", (d,))
        self.in_t = np.ascontiguousarray(w("in_proj.weight", (d, 2 * d)).T)
        p = "block."
        nh, nkv, hd = self.n_heads, self.n_kv, self.hd
        self.op_norm = w(p + "operator_norm.weight", (d,))
        self.q_t = np.ascontiguousarray(w(p + "self_attn.q_proj.weight", (nh * hd, d)).T)
        self.k_t = np.ascontiguousarray(w(p + "self_attn.k_proj.weight", (nkv * hd, d)).T)
        self.v_t = np.ascontiguousarray(w(p + "self_attn.v_proj.weight", (nkv * hd, d)).T)
        self.o_t = np.ascontiguousarray(w(p + "self_attn.out_proj.weight", (d, nh * hd)).T)
        self.q_norm = w(p + "self_attn.q_layernorm.weight", (hd,))
        self.k_norm = w(p + "self_attn.k_layernorm.weight", (hd,))
        self.ffn_norm = w(p + "ffn_norm.weight", (d,))
        f = int(config["ffn_dim"])
        self.w1_t = np.ascontiguousarray(w(p + "feed_forward.w1.weight", (f, d)).T)
        self.w3_t = np.ascontiguousarray(w(p + "feed_forward.w3.weight", (f, d)).T)
        self.w2_t = np.ascontiguousarray(w(p + "feed_forward.w2.weight", (d, f)).T)
        self.norm = w("norm.weight", (d,))
        self.embed = emb
        self.head_t = np.ascontiguousarray(emb.T)
        self.parameters = sum(int(np.asarray(v).size) for v in weights.values())
        inv = 1.0 / (float(config["rope_theta"]) ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        ang = np.arange(self.max_context, dtype=np.float64)[:, None] * inv[None, :]
        emb2 = np.concatenate((ang, ang), axis=-1)
        half = hd // 2
        self.cos = np.cos(emb2).astype(_F32)
        sin = np.sin(emb2)
        self.sin_signed = np.concatenate((-sin[:, :half], sin[:, half:]), axis=-1).astype(_F32)
        self.perm = np.concatenate((np.arange(half, hd), np.arange(half)))
        self.scale = _F32(1.0 / math.sqrt(hd))

    def new_cache(self) -> tuple[np.ndarray, np.ndarray]:
        shape = (self.n_kv, self.max_context, self.hd)
        return np.zeros(shape, _F32), np.zeros(shape, _F32)

    def fuse(self, feats: Mapping[int, np.ndarray], start: int, stop: int) -> np.ndarray:
        """The head's input hidden for feature rows ``start:stop``: fused (EAGLE) or the last layer as is (MTP)."""
        rows = [np.asarray(feats[layer][start:stop], dtype=_F32) for layer in self.feature_layers]
        if self.fc_t is None:
            return np.ascontiguousarray(rows[0])
        return _linear(np.ascontiguousarray(np.concatenate(rows, axis=1)), self.fc_t)

    def step(
        self, cache: tuple[np.ndarray, np.ndarray], start: int, tokens: Sequence[int], hidden: np.ndarray
    ) -> np.ndarray:
        """Head positions ``start .. start + len(tokens) - 1``: writes their K/V, returns their output hiddens."""
        kc, vc = cache
        q = len(tokens)
        nh, nkv, hd = self.n_heads, self.n_kv, self.hd
        e = _rms_norm(self.embed[np.asarray(tokens, dtype=np.intp)], self.embed_norm, self.eps)
        s = _rms_norm(np.asarray(hidden, dtype=_F32), self.hidden_norm, self.eps)
        h = _linear(np.ascontiguousarray(np.concatenate((e, s), axis=1)), self.in_t)
        x = _rms_norm(h, self.op_norm, self.eps)
        qh = _rms_norm(_linear(x, self.q_t).reshape(q, nh, hd), self.q_norm, self.eps)
        kh = _rms_norm(_linear(x, self.k_t).reshape(q, nkv, hd), self.k_norm, self.eps)
        vh = _linear(x, self.v_t).reshape(q, nkv, hd)
        cos = self.cos[start : start + q, None, :]
        sin = self.sin_signed[start : start + q, None, :]
        qh = qh * cos + qh[..., self.perm] * sin
        kh = kh * cos + kh[..., self.perm] * sin
        kc[:, start : start + q] = kh.transpose(1, 0, 2)
        vc[:, start : start + q] = vh.transpose(1, 0, 2)
        qg = (qh * self.scale).reshape(q, nkv, nh // nkv, hd)
        o = np.empty((q, nkv, nh // nkv, hd), _F32)
        for i in range(q):  # row i attends to keys 0 .. start + i, as a one-position step there would
            n = start + i + 1
            sc = np.matmul(qg[i], kc[:, :n].transpose(0, 2, 1))
            sc -= sc.max(axis=-1, keepdims=True)
            ex = np.exp(sc)
            np.divide(np.matmul(ex, vc[:, :n]), np.add.reduce(ex, axis=-1, keepdims=True), out=o[i])
        h = h + _linear(o.reshape(q, nh * hd), self.o_t)
        y = _rms_norm(h, self.ffn_norm, self.eps)
        with np.errstate(over="ignore"):
            h = h + _linear(_silu(_linear(y, self.w1_t)) * _linear(y, self.w3_t), self.w2_t)
        return h

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        return _linear(_rms_norm(np.atleast_2d(hidden), self.norm, self.eps), self.head_t)


HeadRollback = Literal["truncate", "replay"]


class HeadDrafter:
    """A feature drafter over a ``FeatureHead`` (docs/contract.md, "Feature drafters").

    ``propose(context, k, features=F)``: ``F[layer]`` has one row per position of
    ``context[:-1]``; the head catches up on the positions it has not seen (the accepted
    draft tokens and the bonus token, with their features), drafts the first token from
    its last real position, then chains ``k - 1`` more. Without ``features`` it computes
    them with its own copy of the target (``make_target()``, fed incrementally), so plain
    drafter checks and engines without feature support still get the same drafts.

    ``feature_target_spec`` names the target the head was trained on (a ``--target`` spec),
    so the conformance suite can compute features independently of this drafter.
    ``rollback``: ``"truncate"`` (the head's KV is append-only: positions after the accepted
    prefix are overwritten) or ``"replay"`` (the chain's slots are snapshotted and restored).
    ``propose_sampled(context, k, sampling=, rng=, features=)`` draws each token from the head's
    processed distribution and returns the rows as ``q`` (a ``SamplingDrafter``).
    Counters: ``proposals``, ``head_positions`` (real positions computed), ``chain_steps``.
    """

    def __init__(
        self,
        head: FeatureHead,
        make_target: Callable[[], Target],
        *,
        name: str,
        feature_target_spec: str | None = None,
        rollback: HeadRollback = "truncate",
    ) -> None:
        if rollback not in ("truncate", "replay"):
            raise InvalidSettingError(f"HeadDrafter rollback={rollback!r} is not 'truncate' or 'replay'")
        self.head = head
        self.feature_layers: tuple[int, ...] = head.feature_layers
        self.vocab_size = head.vocab_size
        self.max_context = head.max_context
        self.name = name
        self.feature_target_spec = feature_target_spec
        self.rollback: HeadRollback = rollback
        self._make_target = make_target
        self._target: Target | None = None
        self._cache = head.new_cache()
        self._out = np.zeros((head.max_context, head.d_model), _F32)
        self.reset()

    def __repr__(self) -> str:
        return f"HeadDrafter({self.name}, kind={self.head.kind}, rollback={self.rollback!r})"

    def reset(self) -> None:
        """Forget everything (the head's positions and the own target's features): a fresh drafter."""
        self._toks: list[int] = []  # context tokens the head's real positions consumed: c_0 .. c_n
        self._n = 0  # real (accepted, real-feature) head positions held
        self._ftoks: list[int] = []
        self._frows: dict[int, list[np.ndarray]] = {layer: [] for layer in self.feature_layers}
        if self._target is not None:
            self._target.reset()
        self.proposals = 0
        self.head_positions = 0
        self.chain_steps = 0

    # ------------------------------------------------------------------ features

    def _own_features(self, context: Sequence[int]) -> dict[int, np.ndarray]:
        """Features of ``context[:-1]`` from the drafter's own target, fed incrementally (restarted on divergence)."""
        if self._target is None:
            self._target = self._make_target()
            self._target.reset()
        want = [int(t) for t in context[:-1]]
        c = 0
        limit = min(len(self._ftoks), len(want))
        while c < limit and self._ftoks[c] == want[c]:
            c += 1
        if c < len(self._ftoks):
            self._target.reset()
            self._ftoks = []
            self._frows = {layer: [] for layer in self.feature_layers}
        new = want[len(self._ftoks) :]
        if new:
            _, feats, _ = self._target.forward_with_features(new, self.feature_layers)  # type: ignore[attr-defined]
            for layer in self.feature_layers:
                self._frows[layer].append(np.asarray(feats[layer], dtype=_F32))
            self._ftoks.extend(new)
        out = {}
        for layer in self.feature_layers:
            parts = self._frows[layer]
            if len(parts) > 1:
                self._frows[layer] = parts = [np.concatenate(parts)]
            out[layer] = parts[0] if parts else np.zeros((0, self.head.d_model), _F32)
        return out

    def _checked(self, features: Mapping[int, np.ndarray], rows: int) -> Mapping[int, np.ndarray]:
        for layer in self.feature_layers:
            if layer not in features:
                raise DrafterContractError(
                    f"{self.name}: the engine handed no features for layer {layer} (needs {list(self.feature_layers)})"
                )
            arr = features[layer]
            shape = getattr(arr, "shape", None)
            if shape is None or len(shape) != 2 or shape[0] < rows or shape[1] != self.head.d_model:
                raise DrafterContractError(
                    f"{self.name}: features[{layer}] has shape {shape}; expected [{rows}, {self.head.d_model}] "
                    f"(one row per position of context[:-1])"
                )
        return features

    # ------------------------------------------------------------------ drafting

    def propose(self, context: Sequence[int], k: int, *, features: Mapping[int, np.ndarray] | None = None) -> list[int]:
        """Up to ``k`` tokens: the argmax of the head's logits at the last real position, then along the chain."""
        return [token for token, _ in self._draft(context, k, features, argmax_pick)]

    def propose_sampled(
        self,
        context: Sequence[int],
        k: int,
        *,
        sampling: SamplingParams,
        rng: np.random.Generator,
        features: Mapping[int, np.ndarray] | None = None,
    ) -> SampledDraft:
        """Up to ``k`` tokens each drawn with ``rng`` from the head's processed distribution at ``sampling``
        (the first from the last real position, the next along the chain); ``q[i]`` is ``tokens[i]``'s row."""
        return sampled_draft(self._draft(context, k, features, sampling_pick(sampling, rng)), self.vocab_size)

    def _draft(
        self, context: Sequence[int], k: int, features: Mapping[int, np.ndarray] | None, pick: Pick
    ) -> list[tuple[int, np.ndarray | None]]:
        m = len(context)
        if k <= 0 or m < 2 or m - 1 > self.max_context:
            return []  # no feature yet (a one-token context), or past the head's capacity
        k = min(int(k), self.max_context - (m - 1) + 1)
        self.proposals += 1
        head = self.head
        last = self._catch_up(context, features)
        draft = [pick(head.logits(last)[0])]
        pos = m - 1
        saved = None
        if self.rollback == "replay" and k > 1:  # snapshot the chain's cache slots, put them back after
            saved = (self._cache[0][:, pos : pos + k - 1].copy(), self._cache[1][:, pos : pos + k - 1].copy())
        while len(draft) < k:  # the chain: positions past the accepted prefix, overwritten next call
            last = head.step(self._cache, pos, [draft[-1][0]], last[None, :])[0]
            draft.append(pick(head.logits(last)[0]))
            pos += 1
            self.chain_steps += 1
        if saved is not None:
            self._cache[0][:, m - 1 : m - 1 + saved[0].shape[1]] = saved[0]
            self._cache[1][:, m - 1 : m - 1 + saved[1].shape[1]] = saved[1]
        return draft

    def _catch_up(self, context: Sequence[int], features: Mapping[int, np.ndarray] | None) -> np.ndarray:
        """Bring the head's real positions to ``context[:-1]`` (``len(context) >= 2``) and return the output
        hidden of the last one, which predicts the first draft token (the tree drafters build on it too)."""
        m = len(context)
        feats = self._own_features(context) if features is None else self._checked(features, m - 1)
        head = self.head
        # head position i consumed (feature i, token i + 1): reusable while the tokens agree
        c = 0
        limit = min(len(self._toks), m)
        while c < limit and self._toks[c] == int(context[c]):
            c += 1
        reuse = min(self._n, max(c - 1, 0))
        if reuse < m - 1:
            toks = [int(t) for t in context[reuse + 1 : m]]
            hid = head.step(self._cache, reuse, toks, head.fuse(feats, reuse, m - 1))
            self._out[reuse : m - 1] = hid
            self.head_positions += m - 1 - reuse
        self._n = m - 1
        self._toks = [int(t) for t in context[:m]]
        return self._out[m - 2]
