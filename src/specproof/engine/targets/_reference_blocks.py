"""The blocks of the reference target: kernels, feed-forwards and the three mixers.

Every kernel maps rows independently and treats each row identically whatever the
number of rows, which is what makes ``ReferenceHybrid`` exactly batch-invariant (see
``specproof.engine.targets.reference``). A block holds its transposed weights and its
slot in the model's state arrays; ``mix`` runs its token mixer over the normed residual
``x`` and updates the state it is handed in place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from specproof.engine.targets._reference_routers import select_experts

FloatArray = npt.NDArray[np.float32]
_Arr = npt.NDArray[Any]

_L2_EPS: Final = 1e-6  # Qwen3-Next's l2norm epsilon for the GDN q and k
_F32 = np.float32


# --------------------------------------------------------------------------- kernels
# Every kernel maps rows independently and treats each row identically whatever the
# number of rows, which is what makes the model exactly batch-invariant.


def _linear(x: _Arr, w_t: _Arr) -> _Arr:
    """``x @ w_t`` for ``x`` [q, n]: a stack of ``[1, n] @ [n, m]`` products, one BLAS call per row.

    A plain ``[q, n] @ [n, m]`` is a gemm whose blocking (and rounding) depends on q.
    """
    return np.matmul(x[:, None, :], w_t)[:, 0, :]


def _rms_norm(x: _Arr, weight: _Arr, eps: float) -> _Arr:
    """LFM2 RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * weight``."""
    ms = np.add.reduce(x * x, axis=-1, keepdims=True)
    ms /= x.shape[-1]
    ms += eps
    return x / np.sqrt(ms) * weight


def _silu(x: _Arr) -> _Arr:
    # -x is a fresh contiguous array, so exp always takes the same (SIMD) path.
    return x / (1.0 + np.exp(-x))


# --------------------------------------------------------------------------- blocks


class DenseFfn:
    """SwiGLU: ``w2(silu(w1 x) * w3 x)`` (w1 and w3 fused into one projection)."""

    __slots__ = ("f", "w2_t", "w13_t")

    def __init__(self, w1: FloatArray, w3: FloatArray, w2: FloatArray) -> None:
        self.f = w1.shape[0]
        self.w13_t = np.ascontiguousarray(np.concatenate((w1, w3)).T)
        self.w2_t = np.ascontiguousarray(w2.T)

    def __call__(self, x: _Arr) -> _Arr:
        gu = _linear(x, self.w13_t)
        return _linear(_silu(gu[:, : self.f]) * gu[:, self.f :], self.w2_t)


class SharedExpert:
    """Qwen3-Next's shared expert: a SwiGLU every row runs, scaled by ``sigmoid(shared_expert_gate(x))``."""

    __slots__ = ("ffn", "gate_t")

    def __init__(self, ffn: DenseFfn, gate: FloatArray) -> None:
        self.ffn = ffn
        self.gate_t = np.ascontiguousarray(gate.T)  # [d, 1]

    def __call__(self, x: _Arr) -> _Arr:
        return self.ffn(x) * (1.0 / (1.0 + np.exp(-_linear(x, self.gate_t))))


class MoeFfn:
    """Mixture of SwiGLU experts: a router (``_reference_routers``: softmax, or sigmoid with an expert bias)
    picks the top k (ties to the lower index), renormalised; plus an optional gated shared expert.

    Stateless like every block (copies of a model share their blocks): ``route`` returns the
    experts each row chose beside the output.
    """

    __slots__ = ("expert_bias", "experts", "gate_t", "k", "shared")

    def __init__(
        self,
        gate: FloatArray,
        experts: list[DenseFfn],
        k: int,
        *,
        expert_bias: FloatArray | None = None,
        shared: SharedExpert | None = None,
    ) -> None:
        self.gate_t = np.ascontiguousarray(gate.T)
        self.experts = experts
        self.k = k
        self.expert_bias = expert_bias
        self.shared = shared

    def route(self, x: _Arr) -> tuple[_Arr, npt.NDArray[np.int64], _Arr]:
        """The output rows, the read-only ``[q, k]`` expert ids each row chose, and each row's router margin
        (``router_margins`` of the scores the selection ranked)."""
        chosen, w, ranked = select_experts(_linear(x, self.gate_t), self.k, self.expert_bias)
        q = x.shape[0]
        ys = np.empty((q, self.k, x.shape[1]), _F32)
        for expert in np.unique(chosen).tolist():
            rows, slots = np.nonzero(chosen == expert)
            ys[rows, slots] = self.experts[expert](x[rows])
        # combine in slot order: the same additions for a row whatever q is
        out = ys[:, 0] * w[:, 0:1]
        for s in range(1, self.k):
            out += ys[:, s] * w[:, s : s + 1]
        if self.shared is not None:
            out += self.shared(x)
        margins = router_margins(ranked, chosen)
        chosen = chosen.astype(np.int64)
        chosen.flags.writeable = False
        return out, chosen, margins


def router_margins(logits: _Arr, chosen: npt.NDArray[np.intp]) -> _Arr:
    """Per row, the smallest nonzero gap between a chosen expert's router logit and an unchosen one's (for the
    sigmoid router: its selection scores in logit units, ``_reference_routers.SIGMOID_MARGIN_SCALE``).

    An exact tie (equal logits, as experts with one router row give) is broken by index and is
    not a margin; a small nonzero gap is one that a lower-precision copy of the model (an fp16
    export) may order the other way. ``inf`` where no such pair exists (k = E)."""
    q, n = logits.shape
    picked = np.zeros((q, n), np.bool_)
    np.put_along_axis(picked, chosen, True, axis=-1)
    gaps = logits[:, :, None] - logits[:, None, :]  # [q, chosen e, other j]
    valid = picked[:, :, None] & ~picked[:, None, :] & (gaps != 0)
    return np.where(valid, np.abs(gaps), np.inf).min(axis=(1, 2)).astype(_F32)


Ffn = DenseFfn | MoeFfn


def short_conv(conv_state: _Arr, slot: int, channels: int, kernel: _Arr, xin: _Arr, record: _Arr | None) -> _Arr:
    """Causal depthwise conv over time: ``out_t = sum_l kernel[l] * x_{t-L+1+l}``, history from ``conv_state``.

    Updates ``conv_state[slot]`` to the last ``L - 1`` inputs; ``record[i, slot]``
    gets the state after each position.
    """
    q = xin.shape[0]
    width = kernel.shape[0] - 1
    if width:
        state = conv_state[slot, :channels]  # [C, L-1], oldest first
        full = np.concatenate((state.T, xin))  # [L-1+q, C]
        state[...] = full[q:].T
        if record is not None:
            # window s of L-1 rows starting at s is the state after s inputs of this forward
            record[:, slot, :channels] = sliding_window_view(full, width, axis=0)[1:]
    else:
        full = np.ascontiguousarray(xin)
    # taps summed in a fixed order, elementwise: exact and independent of q
    acc = full[0:q] * kernel[0]
    for tap in range(1, width + 1):
        acc += full[tap : tap + q] * kernel[tap]
    return acc


class ConvBlock:
    """LFM2 gated short conv: ``B, C, x = split(in_proj(h))``; ``out_proj(C * causal_conv(B * x))``."""

    __slots__ = ("d", "ffn", "ffn_norm", "in_t", "kernel", "op_norm", "out_t", "slot")

    def __init__(self, w: Mapping[str, FloatArray], p: str, slot: int, ffn: Ffn) -> None:
        self.op_norm = w[p + "operator_norm.weight"]
        self.ffn_norm = w[p + "ffn_norm.weight"]
        self.in_t = np.ascontiguousarray(w[p + "conv.in_proj.weight"].T)
        self.kernel = np.ascontiguousarray(w[p + "conv.conv.weight"][:, 0, :].T)  # [L, d]
        self.out_t = np.ascontiguousarray(w[p + "conv.out_proj.weight"].T)
        self.d = self.out_t.shape[1]
        self.slot = slot
        self.ffn = ffn

    def mix(self, x: _Arr, conv_state: _Arr, record: _Arr | None) -> _Arr:
        d = self.d
        bcx = _linear(x, self.in_t)
        bx = bcx[:, :d] * bcx[:, 2 * d :]
        y = bcx[:, d : 2 * d] * short_conv(conv_state, self.slot, d, self.kernel, bx, record)
        return _linear(y, self.out_t)


def rope_tables(head_dim: int, theta: float, max_context: int) -> tuple[FloatArray, FloatArray]:
    """``cos`` and signed ``sin`` ``[max_context, head_dim]`` (computed in float64, stored in float32).

    ``rotate_half(x) * sin == x[..., perm] * signed_sin``, bit for bit (negation is exact).
    """
    hd = head_dim
    half = hd // 2
    inv_freq = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    angles = np.arange(max_context, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate((angles, angles), axis=-1)
    cos = np.cos(emb).astype(_F32)
    sin = np.sin(emb)
    sin_signed = np.concatenate((-sin[:, :half], sin[:, half:]), axis=-1).astype(_F32)
    return cos, sin_signed


class AttnBlock:
    """GQA with per-head QK RMSNorm and rotate-half RoPE, causal over the KV cache; with ``output_gate``
    Qwen3-Next's gated attention: ``q_proj`` gives each head its query and a gate (``[q_h | gate_h]``, head by
    head) and the heads' output is multiplied by ``sigmoid(gate)`` before ``out_proj``."""

    __slots__ = (
        "eps",
        "ffn",
        "ffn_norm",
        "gated",
        "hd",
        "n_h",
        "n_kv",
        "op_norm",
        "out_t",
        "perm",
        "qk_norm",
        "qkv_t",
        "scale",
        "slot",
    )

    def __init__(
        self,
        w: Mapping[str, FloatArray],
        p: str,
        slot: int,
        ffn: Ffn,
        *,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        eps: float,
        output_gate: bool = False,
    ) -> None:
        a = p + "self_attn."
        self.op_norm = w[p + "operator_norm.weight"]
        self.ffn_norm = w[p + "ffn_norm.weight"]
        q_proj = w[a + "q_proj.weight"]
        self.gated = bool(output_gate)
        gate: list[FloatArray] = []
        if self.gated:  # rows [query of head 0, gate of head 0, query of head 1, ...]: the gate rows go last
            halves = q_proj.reshape(n_heads, 2, head_dim, -1)
            q_proj, gate = halves[:, 0].reshape(n_heads * head_dim, -1), [halves[:, 1].reshape(n_heads * head_dim, -1)]
        qkv = np.concatenate((q_proj, w[a + "k_proj.weight"], w[a + "v_proj.weight"], *gate))
        self.qkv_t = np.ascontiguousarray(qkv.T)
        self.out_t = np.ascontiguousarray(w[a + "out_proj.weight"].T)
        # one norm weight row per head of concat(q, k): q heads use q_layernorm, kv heads k_layernorm
        self.qk_norm = np.concatenate(
            (
                np.broadcast_to(w[a + "q_layernorm.weight"], (n_heads, head_dim)),
                np.broadcast_to(w[a + "k_layernorm.weight"], (n_kv_heads, head_dim)),
            )
        )
        self.slot = slot
        self.ffn = ffn
        self.n_h, self.n_kv, self.hd, self.eps = n_heads, n_kv_heads, head_dim, eps
        half = head_dim // 2
        self.perm = np.concatenate((np.arange(half, head_dim), np.arange(half)))
        self.scale = _F32(1.0 / math.sqrt(head_dim))

    def append_kv(self, x: _Arr, base: int, cos: _Arr, sin: _Arr, keys_t: _Arr, value_cache: _Arr) -> _Arr:
        """Write the keys and values of the ``q`` rows of ``x`` (positions ``base ..``) into the cache; return
        the normed, rotated queries and keys ``[q, n_h + n_kv, hd]``. All a forward's state needs of this block."""
        return self._append(x, base, cos, sin, keys_t, value_cache)[0]

    def _append(
        self, x: _Arr, base: int, cos: _Arr, sin: _Arr, keys_t: _Arr, value_cache: _Arr
    ) -> tuple[_Arr, _Arr | None]:
        """``append_kv``, and the output gate's pre-activations ``[q, n_h * hd]`` (``None`` ungated)."""
        q = x.shape[0]
        n_h, n_kv, hd = self.n_h, self.n_kv, self.hd
        total = base + q
        qkv = _linear(x, self.qkv_t)
        nqk = (n_h + n_kv) * hd
        qk = _rms_norm(qkv[:, :nqk].reshape(q, n_h + n_kv, hd), self.qk_norm, self.eps)
        qk = qk * cos + qk[..., self.perm] * sin  # RoPE, rotate-half convention
        keys_t[self.slot][:, :, base:total] = qk[:, n_h:].transpose(1, 2, 0)
        value_cache[self.slot][:, base:total] = qkv[:, nqk : nqk + n_kv * hd].reshape(q, n_kv, hd).transpose(1, 0, 2)
        return qk, (qkv[:, nqk + n_kv * hd :] if self.gated else None)

    def mix(self, x: _Arr, base: int, cos: _Arr, sin: _Arr, keys_t: _Arr, value_cache: _Arr) -> _Arr:
        """Attention of the ``q`` rows of ``x`` (positions ``base ..``) over the cache, after appending theirs.

        ``keys_t`` holds the keys transposed (``[layers, kv, hd, max_context]``), so a row's scores are a
        product with a row-major ``[hd, width]`` matrix.
        """
        q = x.shape[0]
        n_h, n_kv, hd = self.n_h, self.n_kv, self.hd
        qk, gate = self._append(x, base, cos, sin, keys_t, value_cache)
        kt = keys_t[self.slot]  # [kv, hd, max_context]
        vc = value_cache[self.slot]  # [kv, max_context, hd]
        qg = (qk[:, :n_h] * self.scale).reshape(q, n_kv, n_h // n_kv, hd)
        o = np.empty((q, n_kv, n_h // n_kv, hd), _F32)
        runs = key_runs(base, q)
        if np.isfinite(vc[:, base + 1 : runs[-1][2]]).all():
            # the rows of one width in one call: per row, the calls a one-token forward makes
            for lo, hi, width in runs:
                _attend(qg[lo:hi], kt[:, :, :width], vc[:, :width], base + lo + 1, out=o[lo:hi])
        else:
            # a non-finite value would not vanish under its zero weight: zero the padding for real, row by row
            for lo, hi, width in runs:
                for i in range(lo, hi):
                    values = vc[:, :width].copy()
                    values[:, base + i + 1 :] = 0.0
                    _attend(qg[i : i + 1], kt[:, :, :width], values, base + i + 1, out=o[i : i + 1])
        heads: _Arr = o.reshape(q, n_h * hd)
        if gate is not None:
            heads = heads * (1.0 / (1.0 + np.exp(-gate)))
        return _linear(heads, self.out_t)


KEY_BLOCK: Final = 64
"""A row attending to ``n`` keys sums over ``key_width(n)`` cache slots, the ones past ``n`` weighted 0."""


def key_width(attend: int) -> int:
    """How many cache slots a row attending to ``attend`` keys sums over: ``attend`` rounded up to a
    multiple of ``KEY_BLOCK``, a function of ``attend`` alone (not of the batch, nor of ``max_context``).

    This is what lets the rows of one forward share one call: a row's products and sums have the same
    shapes, so the same rounding, whatever the batch. The caches hold ``key_width(max_context)`` slots.
    """
    return -(-attend // KEY_BLOCK) * KEY_BLOCK


def key_runs(base: int, q: int) -> list[tuple[int, int, int]]:
    """``(lo, hi, width)``: rows ``lo .. hi - 1`` of a ``q``-row forward from ``base`` share ``key_width``."""
    runs = []
    lo = 0
    while lo < q:
        width = key_width(base + lo + 1)
        hi = min(q, width - base)  # row i attends to base + i + 1 keys
        runs.append((lo, hi, width))
        lo = hi
    return runs


_PADDING: Final = np.arange(KEY_BLOCK)[None, :] >= np.arange(KEY_BLOCK)[:, None]


def _attend(qg: _Arr, keys_t: _Arr, values: _Arr, first: int, *, out: _Arr) -> None:
    """Softmax attention of rows ``qg`` ``[r, kv, group, hd]`` over ``keys_t`` ``[kv, hd, width]`` and
    ``values`` ``[kv, width, hd]``; row ``j`` attends to the first ``first + j`` keys.

    The other keys of ``width`` get ``exp(-inf) == 0``, exact zeros in the row's sums. Every product
    is a ``[group, hd] @ [hd, width]`` or ``[group, width] @ [width, hd]`` BLAS call and every sum
    runs along one contiguous row of ``width``: a row's bits depend on its inputs and ``width``, not on ``r``.
    """
    s = np.matmul(qg, keys_t)  # [r, kv, group, width]
    # every row attends to the first `first` keys; of the (< KEY_BLOCK) columns after them,
    # row j pads column first + c when c >= j
    tail = keys_t.shape[-1] - first
    if tail:
        np.copyto(s[..., first:], -np.inf, where=_PADDING[: qg.shape[0], None, None, :tail])
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    np.divide(np.matmul(s, values), np.add.reduce(s, axis=-1, keepdims=True), out=out)


class GdnBlock:
    """Gated DeltaNet (Qwen3-Next / Qwen3.5 recurrence, one q/k head per v head)."""

    __slots__ = (
        "conv_dim",
        "dk",
        "dt_bias",
        "dv",
        "eps",
        "ffn",
        "ffn_norm",
        "hg",
        "in_t",
        "kernel",
        "neg_a",
        "norm_w",
        "op_norm",
        "out_t",
        "q_scale",
        "rec_slot",
        "slot",
    )

    def __init__(
        self,
        w: Mapping[str, FloatArray],
        p: str,
        slot: int,
        rec_slot: int,
        ffn: Ffn,
        *,
        heads: int,
        key_dim: int,
        value_dim: int,
        eps: float,
    ) -> None:
        g = p + "linear_attn."
        self.op_norm = w[p + "operator_norm.weight"]
        self.ffn_norm = w[p + "ffn_norm.weight"]
        fused = np.concatenate(
            (
                w[g + "in_proj_qkv.weight"],
                w[g + "in_proj_z.weight"],
                w[g + "in_proj_b.weight"],
                w[g + "in_proj_a.weight"],
            )
        )
        self.in_t = np.ascontiguousarray(fused.T)
        self.kernel = np.ascontiguousarray(w[g + "conv1d.weight"][:, 0, :].T)  # [L, conv_dim]
        self.neg_a = (-np.exp(w[g + "A_log"])).astype(_F32)
        self.dt_bias = w[g + "dt_bias"]
        self.norm_w = w[g + "norm.weight"]
        self.out_t = np.ascontiguousarray(w[g + "out_proj.weight"].T)
        self.hg, self.dk, self.dv, self.eps = heads, key_dim, value_dim, eps
        self.conv_dim = heads * (2 * key_dim + value_dim)
        self.q_scale = _F32(1.0 / math.sqrt(key_dim))
        self.slot = slot
        self.rec_slot = rec_slot
        self.ffn = ffn

    def mix(self, x: _Arr, conv_state: _Arr, rec_state: _Arr, conv_rec: _Arr | None, rec_rec: _Arr | None) -> _Arr:
        q = x.shape[0]
        hg, dk, dv = self.hg, self.dk, self.dv
        cd = self.conv_dim
        proj = _linear(x, self.in_t)  # [q, conv_dim + hg*dv + 2*hg]: qkv, z, b, a
        mixed = _silu(short_conv(conv_state, self.slot, cd, self.kernel, proj[:, :cd], conv_rec))
        z = proj[:, cd : cd + hg * dv]
        b = proj[:, cd + hg * dv : cd + hg * dv + hg]
        a = proj[:, cd + hg * dv + hg :]
        qk = mixed[:, : 2 * hg * dk].reshape(q, 2 * hg, dk)
        qk = qk / np.sqrt(np.add.reduce(qk * qk, axis=-1, keepdims=True) + _L2_EPS)  # L2 norm per head
        qrow = (qk[:, :hg] * self.q_scale)[:, :, None, :]  # [q, hg, 1, dk]
        krow = np.ascontiguousarray(qk[:, hg:])[:, :, None, :]  # [q, hg, 1, dk]
        kcol = krow.transpose(0, 1, 3, 2)  # [q, hg, dk, 1]
        vrow = mixed[:, 2 * hg * dk :].reshape(q, hg, 1, dv)
        beta = (1.0 / (1.0 + np.exp(-b)))[:, :, None, None]
        decay = np.exp(self.neg_a * np.logaddexp(0.0, a + self.dt_bias))[:, :, None, None]  # exp(g)
        state = rec_state[self.rec_slot]  # [hg, dk, dv], updated in place
        o = np.empty((q, hg, 1, dv), _F32)
        for t in range(q):  # the delta rule is sequential by nature
            state *= decay[t]
            delta = (vrow[t] - np.matmul(krow[t], state)) * beta[t]  # v - S^T k, scaled by beta
            state += kcol[t] * delta  # S += k delta^T
            np.matmul(qrow[t], state, out=o[t])  # o = S^T q
            if rec_rec is not None:
                rec_rec[t, self.rec_slot] = state
        o3 = o.reshape(q, hg, dv)
        y = _rms_norm(o3, self.norm_w, self.eps) * _silu(z.reshape(q, hg, dv))  # gated RMSNorm per head
        return _linear(y.reshape(q, hg * dv), self.out_t)


Block = ConvBlock | AttnBlock | GdnBlock


def _swiglu(w: Mapping[str, FloatArray], p: str) -> DenseFfn:
    return DenseFfn(w[p + "w1.weight"], w[p + "w3.weight"], w[p + "w2.weight"])


def build_ffn(w: Mapping[str, FloatArray], p: str, *, n_experts: int, experts_per_token: int) -> Ffn:
    """Block ``p``'s feed-forward: dense SwiGLU, or (``n_experts > 0``) a mixture of SwiGLU experts, with the
    sigmoid router where the weights hold an ``expert_bias`` and a shared expert where they hold one (the
    weights were validated against the config, which says which)."""
    if n_experts:
        f = p + "feed_forward."
        experts = [_swiglu(w, f"{f}experts.{e}.") for e in range(n_experts)]
        shared = None
        if f + "shared_expert_gate.weight" in w:
            shared = SharedExpert(_swiglu(w, f + "shared_expert."), w[f + "shared_expert_gate.weight"])
        return MoeFfn(
            w[f + "gate.weight"], experts, experts_per_token, expert_bias=w.get(f + "expert_bias"), shared=shared
        )
    return DenseFfn(w[p + "feed_forward.w1.weight"], w[p + "feed_forward.w3.weight"], w[p + "feed_forward.w2.weight"])
