"""The MIL of each block of ``ReferenceHybrid`` over one chunk: conv, attention, Gated DeltaNet, feed-forwards.

Every function takes the ``Graph`` of the program being built (the builder, the config,
the weights, the chunk's shared values and the states as they stand) and returns the
block's residual contribution ``[1, q, d]``, updating ``g.kc``/``g.vc``/``g.cs``/``g.rs``.
Compute is fp16 (what the Neural Engine runs); sums of squares are taken in fp32.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs
import numpy as np

from specproof.coreml._options import ExportOptions
from specproof.engine.targets.reference import ReferenceConfig

__all__ = [
    "Graph",
    "attn_block",
    "attn_projections",
    "conv_block",
    "dense_ffn",
    "gdn_block",
    "gdn_output",
    "gdn_sequences",
    "moe_ffn",
    "rms_norm",
]

NEG: Final = -30000.0  # masked attention score: exp underflows to exactly 0 in fp16, no inf arithmetic
L2_EPS: Final = 1e-6  # the reference's l2norm epsilon for the GDN q and k
ROUTER_NORM_EPS: Final = 1e-6  # LFM2-MoE's renormalisation epsilon (a no-op in fp16 at these sums; kept as written)
_I32 = np.int32


def fp16(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float16)


@attrs.define
class Graph:
    """The program under construction: builder, config, weights, options and the chunk's live values."""

    mb: Any
    cfg: ReferenceConfig
    w: dict[str, np.ndarray]
    opts: ExportOptions
    max_query: int
    q: Any = None  # [1] int32: the chunk length
    q_scalar: Any = None  # () int32
    position: Any = None  # [1] int32
    rows: Any = None  # [q] int32: absolute positions of the chunk's rows
    mask: Any = None  # [q, m] bool: causal mask over the full cache
    cos: Any = None
    sin: Any = None
    kc: Any = None
    vc: Any = None
    cs: Any = None
    rs: Any = None

    def W(self, name: str) -> np.ndarray:
        return fp16(self.w[name])


def rms_norm(g: Graph, x: Any, weight: np.ndarray, name: str | None = None) -> Any:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis; mean(x^2) in fp32 (fp16 squares overflow)."""
    mb = g.mb
    x32 = mb.cast(x=x, dtype="fp32")
    ms = mb.reduce_mean(x=mb.mul(x=x32, y=x32), axes=[-1], keep_dims=True)
    inv = mb.cast(x=mb.rsqrt(x=ms, epsilon=float(g.cfg.norm_eps)), dtype="fp16")
    scaled = mb.mul(x=x, y=inv)
    return mb.mul(x=scaled, y=fp16(weight), name=name) if name else mb.mul(x=scaled, y=fp16(weight))


def _cols(g: Graph, x: Any, lo: int, hi: int) -> Any:
    """``x[..., lo:hi]`` of a rank-3 ``[1, q, n]`` tensor."""
    return g.mb.slice_by_index(x=x, begin=[0, 0, lo], end=[1, 0, hi], end_mask=[True, True, False])


def _short_conv(g: Graph, xin: Any, weight: np.ndarray, slot: int, channels: int) -> Any:
    """Causal depthwise conv over time of ``xin`` ``[1, q, C]``, history from ``conv_state[slot, :C]``."""
    mb, width = g.mb, g.cfg.conv_kernel - 1
    xt = mb.transpose(x=xin, perm=[0, 2, 1])  # [1, C, q]
    hist = mb.slice_by_index(x=g.cs, begin=[slot, 0, 0], end=[slot + 1, channels, width])  # [1, C, L-1]
    full = mb.concat(values=[hist, xt], axis=2)  # oldest first
    out = mb.conv(x=full, weight=fp16(weight), groups=channels, pad_type="valid")  # [1, C, q]
    new_hist = mb.slice_by_index(x=full, begin=[0, 0, -width], end=[1, channels, 0], end_mask=[False, False, True])
    if not (g.opts.planted == "state-not-written" and g.cfg.n_gdn_layers == 0):
        g.cs = mb.slice_update(x=g.cs, update=new_hist, begin=[slot, 0, 0], end=[slot + 1, channels, width])
    return mb.transpose(x=out, perm=[0, 2, 1])


def conv_block(g: Graph, x: Any, p: str, slot: int, *, conv: Any = None) -> Any:
    """LFM2 gated short conv: ``B, C, x = split(in_proj(h))``; ``out_proj(C * conv(B * x))``; ``conv``: the
    short conv ``(g, x, weight, slot, channels)`` (default: over the chunk; the tree program gives its own)."""
    mb, d = g.mb, g.cfg.d_model
    bcx = mb.linear(x=x, weight=g.W(p + "conv.in_proj.weight"))  # [1, q, 3d]
    bx = mb.mul(x=_cols(g, bcx, 0, d), y=_cols(g, bcx, 2 * d, 3 * d))
    conv = (conv or _short_conv)(g, bx, g.w[p + "conv.conv.weight"], slot, d)
    return mb.linear(x=mb.mul(x=_cols(g, bcx, d, 2 * d), y=conv), weight=g.W(p + "conv.out_proj.weight"))


def _rope(g: Graph, t: Any) -> Any:
    mb, hd = g.mb, g.cfg.head_dim
    t1 = mb.slice_by_index(x=t, begin=[0, 0, 0, 0], end=[1, 0, 0, hd // 2], end_mask=[True, True, True, False])
    t2 = mb.slice_by_index(x=t, begin=[0, 0, 0, hd // 2], end=[1, 0, 0, hd], end_mask=[True, True, True, False])
    rot = mb.concat(values=[mb.mul(x=t2, y=np.float16(-1.0)), t1], axis=3)  # rotate_half
    return mb.add(x=mb.mul(x=t, y=g.cos), y=mb.mul(x=rot, y=g.sin))


def attn_projections(g: Graph, x: Any, p: str, layer: int) -> tuple[Any, Any, Any, Any]:
    """Queries (normed, RoPE'd at ``g.cos``/``g.sin``, scaled), keys (normed, RoPE'd) and values
    ``[1, q, heads, head_dim]``, and the output gate's pre-activations ``[1, q, heads * head_dim]`` (``None``
    without ``attn_output_gate``): what the chunk and the tree programs share."""
    mb, cfg = g.mb, g.cfg
    hd, n_h, n_kv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    a = p + "self_attn."
    qh = mb.linear(x=x, weight=g.W(a + "q_proj.weight"))
    gate = None
    if cfg.attn_output_gate:  # [query | gate] per head, as Qwen3-Next's q_proj
        pairs = mb.reshape(x=qh, shape=[1, -1, n_h, 2 * hd])
        qh, gate = mb.split(x=pairs, num_splits=2, axis=3)
        gate = mb.reshape(x=gate, shape=[1, -1, n_h * hd])
    qh = mb.reshape(x=qh, shape=[1, -1, n_h, hd])
    kh = mb.reshape(x=mb.linear(x=x, weight=g.W(a + "k_proj.weight")), shape=[1, -1, n_kv, hd])
    vh = mb.reshape(x=mb.linear(x=x, weight=g.W(a + "v_proj.weight")), shape=[1, -1, n_kv, hd])
    qh = rms_norm(g, qh, g.w[a + "q_layernorm.weight"], f"layer{layer}_q_layernorm")
    kh = _rope(g, rms_norm(g, kh, g.w[a + "k_layernorm.weight"], f"layer{layer}_k_layernorm"))
    return mb.mul(x=_rope(g, qh), y=np.float16(1.0 / math.sqrt(hd))), kh, vh, gate


def gated_output(g: Graph, o: Any, gate: Any) -> Any:
    """The heads' output ``[1, q, heads * head_dim]`` times ``sigmoid(gate)`` (Qwen3-Next), as is without a gate."""
    if gate is None or g.opts.planted == "attn-gate-ignored":  # PLANTED BUG (tests only) leaves it out
        return o
    return g.mb.mul(x=o, y=g.mb.sigmoid(x=gate))


def attn_block(g: Graph, x: Any, p: str, slot: int, layer: int) -> Any:
    """GQA with per-head QK RMSNorm and rotate-half RoPE over the KV cache (written at ``position``)."""
    mb, cfg = g.mb, g.cfg
    hd, n_h, n_kv, m = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.max_context
    a = p + "self_attn."
    qh, kh, vh, gate = attn_projections(g, x, p, layer)
    end = mb.add(x=g.position, y=g.q)
    begin = mb.concat(values=[np.array([slot, 0], _I32), g.position, np.array([0], _I32)], axis=0)
    stop = mb.concat(values=[np.array([slot + 1, n_kv], _I32), end, np.array([hd], _I32)], axis=0)
    g.kc = mb.slice_update(x=g.kc, update=mb.transpose(x=kh, perm=[0, 2, 1, 3]), begin=begin, end=stop)
    g.vc = mb.slice_update(x=g.vc, update=mb.transpose(x=vh, perm=[0, 2, 1, 3]), begin=begin, end=stop)
    keys = mb.reshape(
        x=mb.slice_by_index(x=g.kc, begin=[slot, 0, 0, 0], end=[slot + 1, n_kv, m, hd]), shape=[n_kv, m, hd]
    )
    values = mb.reshape(
        x=mb.slice_by_index(x=g.vc, begin=[slot, 0, 0, 0], end=[slot + 1, n_kv, m, hd]), shape=[n_kv, m, hd]
    )
    # heads h = kv * group + g, as the reference groups them; rows ordered (g, position)
    group = n_h // n_kv
    qg = mb.reshape(x=mb.transpose(x=qh, perm=[0, 2, 1, 3]), shape=[n_kv, -1, hd])  # [kv, g*q, hd]
    s = mb.reshape(x=mb.matmul(x=qg, y=keys, transpose_y=True), shape=[n_kv, group, -1, m])
    s = mb.select(cond=g.mask, a=s, b=np.float16(NEG))
    o = mb.matmul(x=mb.reshape(x=mb.softmax(x=s, axis=-1), shape=[n_kv, -1, m]), y=values)
    o = mb.transpose(x=mb.reshape(x=o, shape=[n_kv, group, -1, hd]), perm=[2, 0, 1, 3])  # [q, kv, g, hd]
    o = gated_output(g, mb.reshape(x=o, shape=[1, -1, n_h * hd]), gate)
    return mb.linear(x=o, weight=g.W(a + "out_proj.weight"))


def _l2_norm(g: Graph, x: Any) -> Any:
    mb = g.mb
    x32 = mb.cast(x=x, dtype="fp32")
    ss = mb.reduce_sum(x=mb.mul(x=x32, y=x32), axes=[-1], keep_dims=True)
    return mb.mul(x=x, y=mb.cast(x=mb.rsqrt(x=ss, epsilon=L2_EPS), dtype="fp16"))


def _delta_step(g: Graph, state: Any, k: Any, q: Any, v: Any, beta: Any, decay: Any) -> tuple[Any, Any]:
    """One token of the delta rule (per head): ``S *= decay; S += k (beta (v - S^T k))^T; o = S^T q``."""
    mb = g.mb
    state = mb.mul(x=state, y=decay)  # [hg, dk, dv] * [hg, 1, 1]
    delta = mb.mul(x=mb.sub(x=v, y=mb.matmul(x=k, y=state)), y=beta)  # [hg, 1, dv]
    state = mb.add(x=state, y=mb.matmul(x=k, y=delta, transpose_x=True))  # k^T delta: [hg, dk, dv]
    return state, mb.matmul(x=q, y=state)  # [hg, 1, dv]


def _gdn_unrolled(g: Graph, state: Any, seq: dict[str, Any]) -> Any:
    """max_query masked steps: step t reads token min(t, q-1) and changes the state only when t < q."""
    mb = g.mb
    last = mb.sub(x=g.q_scalar, y=np.int32(1))
    outs = []
    for t in range(g.max_query):
        idx = mb.minimum(x=np.int32(t), y=last)
        row = {key: mb.gather(x=val, indices=idx, axis=0) for key, val in seq.items()}
        new, o = _delta_step(g, state, row["k"], row["q"], row["v"], row["beta"], row["decay"])
        state = new if t == 0 else mb.select(cond=mb.less(x=np.int32(t), y=g.q_scalar), a=new, b=state)
        outs.append(mb.expand_dims(x=o, axes=[0]))
    out = mb.concat(values=outs, axis=0) if len(outs) > 1 else outs[0]  # [max_query, hg, 1, dv]
    cfg = g.cfg
    stop = mb.concat(values=[g.q, np.array([cfg.gdn_heads, 1, cfg.gdn_value_dim], _I32)], axis=0)
    return state, mb.slice_by_index(x=out, begin=[0, 0, 0, 0], end=stop)


def _gdn_loop(g: Graph, state: Any, seq: dict[str, Any]) -> Any:
    """A while_loop of q steps; the outputs are written into a [max_query, hg, 1, dv] buffer."""
    mb, cfg = g.mb, g.cfg
    hg, dv = cfg.gdn_heads, cfg.gdn_value_dim
    buffer = np.zeros((g.max_query, hg, 1, dv), np.float16)

    def cond(i: Any, s: Any, acc: Any) -> Any:
        return mb.less(x=i, y=g.q_scalar)

    def body(i: Any, s: Any, acc: Any) -> Any:
        row = {key: mb.gather(x=val, indices=i, axis=0) for key, val in seq.items()}
        s, o = _delta_step(g, s, row["k"], row["q"], row["v"], row["beta"], row["decay"])
        i1 = mb.expand_dims(x=i, axes=[0])
        begin = mb.concat(values=[i1, np.array([0, 0, 0], _I32)], axis=0)
        end = mb.concat(values=[mb.add(x=i1, y=np.int32(1)), np.array([hg, 1, dv], _I32)], axis=0)
        acc = mb.slice_update(x=acc, update=mb.expand_dims(x=o, axes=[0]), begin=begin, end=end)
        return mb.add(x=i, y=np.int32(1)), s, acc

    _, state, out = mb.while_loop(_cond=cond, _body=body, loop_vars=(np.int32(0), state, buffer))
    stop = mb.concat(values=[g.q, np.array([hg, 1, dv], _I32)], axis=0)
    return state, mb.slice_by_index(x=out, begin=[0, 0, 0, 0], end=stop)


def _gdn_last_token(g: Graph, state: Any, seq: dict[str, Any]) -> Any:
    """PLANTED BUG (tests only): the chunk's state update sees only its last token; every row reads that state."""
    mb = g.mb
    last = mb.sub(x=g.q_scalar, y=np.int32(1))
    row = {key: mb.gather(x=val, indices=last, axis=0) for key, val in seq.items()}
    state, _ = _delta_step(g, state, row["k"], row["q"], row["v"], row["beta"], row["decay"])
    return state, mb.matmul(x=seq["q"], y=state)  # [q, hg, 1, dk] @ [hg, dk, dv]


def gdn_block(g: Graph, x: Any, p: str, slot: int, rec_slot: int) -> Any:
    """Gated DeltaNet: short conv over concat(q, k, v), L2-normed q/k, gated delta rule, gated RMSNorm."""
    mb, cfg = g.mb, g.cfg
    hg, dk, dv, cd = cfg.gdn_heads, cfg.gdn_key_dim, cfg.gdn_value_dim, cfg.gdn_conv_dim
    a = p + "linear_attn."
    qkv = mb.linear(x=x, weight=g.W(a + "in_proj_qkv.weight"))  # [1, q, cd]
    seq = gdn_sequences(g, x, p, mb.silu(x=_short_conv(g, qkv, g.w[a + "conv1d.weight"], slot, cd)))
    state = mb.reshape(x=mb.slice_by_index(x=g.rs, begin=[rec_slot, 0, 0, 0], end=[rec_slot + 1, hg, dk, dv]),
                       shape=[hg, dk, dv])  # fmt: skip
    if g.opts.planted == "gdn-last-token":
        state, o = _gdn_last_token(g, state, seq)
    elif g.opts.gdn == "loop":
        state, o = _gdn_loop(g, state, seq)
    else:
        state, o = _gdn_unrolled(g, state, seq)
    if g.opts.planted != "state-not-written":
        update = mb.expand_dims(x=state, axes=[0])
        g.rs = mb.slice_update(x=g.rs, update=update, begin=[rec_slot, 0, 0, 0], end=[rec_slot + 1, hg, dk, dv])
    return gdn_output(g, x, p, o)


def gdn_sequences(g: Graph, x: Any, p: str, mixed: Any) -> dict[str, Any]:
    """The delta rule's per-token rows ``k, q, v, beta, decay`` (``[q, heads, 1, .]``) from the block input ``x``
    and ``mixed`` (the short conv's output after SiLU): what the chunk and the tree programs share."""
    mb, cfg = g.mb, g.cfg
    hg, dk, dv, cd = cfg.gdn_heads, cfg.gdn_key_dim, cfg.gdn_value_dim, cfg.gdn_conv_dim
    a = p + "linear_attn."
    qk = _l2_norm(g, mb.reshape(x=_cols(g, mixed, 0, 2 * hg * dk), shape=[-1, 2 * hg, dk]))  # [q, 2hg, dk]
    qh = mb.slice_by_index(x=qk, begin=[0, 0, 0], end=[0, hg, dk], end_mask=[True, False, False])
    kh = mb.slice_by_index(x=qk, begin=[0, hg, 0], end=[0, 2 * hg, dk], end_mask=[True, False, False])
    vh = mb.reshape(x=_cols(g, mixed, 2 * hg * dk, cd), shape=[-1, hg, 1, dv])
    b = mb.reshape(x=mb.linear(x=x, weight=g.W(a + "in_proj_b.weight")), shape=[-1, hg, 1, 1])
    av = mb.reshape(x=mb.linear(x=x, weight=g.W(a + "in_proj_a.weight")), shape=[-1, hg, 1, 1])
    neg_a = fp16((-np.exp(g.w[a + "A_log"].astype(np.float64))).reshape(hg, 1, 1))
    sp = mb.softplus(x=mb.add(x=av, y=fp16(g.w[a + "dt_bias"].reshape(hg, 1, 1))))
    seq = {
        "k": mb.expand_dims(x=kh, axes=[2]),  # [q, hg, 1, dk]
        "q": mb.expand_dims(x=mb.mul(x=qh, y=np.float16(1.0 / math.sqrt(dk))), axes=[2]),
        "v": vh,
        "beta": mb.sigmoid(x=b),  # [q, hg, 1, 1]
        "decay": mb.exp(x=mb.mul(x=sp, y=neg_a)),
    }
    return seq


def gdn_output(g: Graph, x: Any, p: str, o: Any) -> Any:
    """The block's output from the delta rule's rows ``o`` ``[q, heads, 1, dv]``: gated RMSNorm, out_proj."""
    mb, cfg = g.mb, g.cfg
    hg, dv = cfg.gdn_heads, cfg.gdn_value_dim
    a = p + "linear_attn."
    y = rms_norm(g, mb.reshape(x=o, shape=[-1, hg, dv]), g.w[a + "norm.weight"])  # gated RMSNorm per head
    z = mb.reshape(x=mb.linear(x=x, weight=g.W(a + "in_proj_z.weight")), shape=[-1, hg, dv])
    y = mb.reshape(x=mb.mul(x=y, y=mb.silu(x=z)), shape=[1, -1, hg * dv])
    return mb.linear(x=y, weight=g.W(a + "out_proj.weight"))


def dense_ffn(g: Graph, x: Any, p: str) -> Any:
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""
    mb = g.mb
    gate = mb.silu(x=mb.linear(x=x, weight=g.W(p + "w1.weight")))
    up = mb.linear(x=x, weight=g.W(p + "w3.weight"))
    return mb.linear(x=mb.mul(x=gate, y=up), weight=g.W(p + "w2.weight"))


def _tie_matrix(n: int, *, lower: bool) -> np.ndarray:
    """``T[e, j]``: expert j beats expert e on a tie (j < e: ties go to the lower index)."""
    e, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return (j < e) if lower else (j > e)


def _router(g: Graph, x: Any, p: str) -> tuple[Any, Any, Any]:
    """``(logits, ranked, scores)``: the router logits, the scores the top-k ranks (softmax: the logits, which
    order as the probabilities do; sigmoid: ``sigmoid(logits) + expert_bias``) and the scores the chosen experts
    are weighted by before renormalisation (softmax probabilities; sigmoid scores without the bias)."""
    mb = g.mb
    logits = mb.linear(x=x, weight=g.W(p + "feed_forward.gate.weight"))  # [1, q, E]
    if g.cfg.router != "sigmoid":
        return logits, logits, mb.softmax(x=logits, axis=-1)
    scores = mb.sigmoid(x=logits)
    if g.opts.planted == "expert-bias-ignored":  # PLANTED BUG (tests only): selection on the bare scores
        return logits, scores, scores
    return logits, mb.add(x=scores, y=g.W(p + "feed_forward.expert_bias")), scores


def _shared_expert(g: Graph, x: Any, p: str) -> Any:
    """Qwen3-Next's shared expert: ``sigmoid(shared_expert_gate(x)) * swiglu(x)``."""
    mb = g.mb
    y = dense_ffn(g, x, p + "feed_forward.shared_expert.")
    if g.opts.planted == "shared-gate-ignored":  # PLANTED BUG (tests only): the gate's scale left out
        return y
    gate = mb.sigmoid(x=mb.linear(x=x, weight=g.W(p + "feed_forward.shared_expert_gate.weight")))  # [1, q, 1]
    return mb.mul(x=y, y=gate)


def moe_ffn(g: Graph, x: Any, p: str) -> Any:
    """Dense experts under a top-k mask: every expert runs, the router's top k (ties to the lower index,
    as the reference's stable sort) get their renormalised weight, the others 0; plus the shared expert."""
    mb, cfg = g.mb, g.cfg
    n, k = cfg.n_experts, cfg.experts_per_token
    _, ranked, scores = _router(g, x, p)
    mine = mb.expand_dims(x=ranked, axes=[-1])  # r_e: [1, q, E, 1]
    other = mb.expand_dims(x=ranked, axes=[-2])  # r_j: [1, q, 1, E]
    ties: Any = _tie_matrix(n, lower=True)
    if g.opts.planted == "router-ties":  # PLANTED BUG (tests only): multi-token forwards break ties upward
        ties = mb.select(cond=mb.greater(x=g.q_scalar, y=np.int32(1)), a=_tie_matrix(n, lower=False), b=ties)
    beaten = mb.logical_or(
        x=mb.greater(x=other, y=mine), y=mb.logical_and(x=mb.equal(x=other, y=mine), y=ties)
    )  # [1, q, E, E]: expert j ranks above expert e
    rank = mb.reduce_sum(x=mb.cast(x=beaten, dtype="int32"), axes=[-1])  # [1, q, E]
    weights = mb.select(cond=mb.less(x=rank, y=np.int32(k)), a=scores, b=np.float16(0.0))
    total = mb.reduce_sum(x=weights, axes=[-1], keep_dims=True)
    if cfg.router == "sigmoid":  # LFM2-MoE divides by sum + 1e-6
        total = mb.add(x=total, y=np.float16(ROUTER_NORM_EPS))
    weights = mb.real_div(x=weights, y=total)
    out = None
    for e in range(n):
        y = dense_ffn(g, x, f"{p}feed_forward.experts.{e}.")
        we = mb.slice_by_index(x=weights, begin=[0, 0, e], end=[1, 0, e + 1], end_mask=[True, True, False])
        term = mb.mul(x=y, y=we)
        out = term if out is None else mb.add(x=out, y=term)
    return mb.add(x=out, y=_shared_expert(g, x, p)) if cfg.shared_expert else out


def layer_stack(g: Graph, h: Any, *, conv: Any, attn: Any, gdn: Any) -> Any:
    """Every block of ``g.cfg.layers`` with its feed-forward over the hidden rows ``h``: ``conv(g, x, p, slot)``,
    ``attn(g, x, p, slot, layer)`` and ``gdn(g, x, p, conv_slot, rec_slot)`` write the mixers (the chunk's or
    the tree's), the residuals, norms and feed-forwards are shared."""
    mb, cfg = g.mb, g.cfg
    n_attn = n_conv = n_rec = 0
    for i, kind in enumerate(cfg.layers):
        p = f"model.layers.{i}."
        x = rms_norm(g, h, g.w[p + "operator_norm.weight"], f"layer{i}_operator_norm")
        if kind == "conv":
            h = mb.add(x=h, y=conv(g, x, p, n_conv))
            n_conv += 1
        elif kind == "attn":
            h = mb.add(x=h, y=attn(g, x, p, n_attn, i))
            n_attn += 1
        else:
            h = mb.add(x=h, y=gdn(g, x, p, n_conv, n_rec))
            n_conv += 1
            n_rec += 1
        x = rms_norm(g, h, g.w[p + "ffn_norm.weight"], f"layer{i}_ffn_norm")
        h = mb.add(x=h, y=moe_ffn(g, x, p) if cfg.is_moe else dense_ffn(g, x, p + "feed_forward."))
    return h


def logits_head(g: Graph, h: Any) -> Any:
    """The final norm and the (tied or own) head over ``h``: the program's fp32 ``logits``."""
    x = rms_norm(g, h, g.w["model.embedding_norm.weight"], "final_norm")
    head = g.w["model.embed_tokens.weight"] if g.cfg.tie_embeddings else g.w["lm_head.weight"]
    return g.mb.cast(x=g.mb.linear(x=x, weight=fp16(head)), dtype="fp32", name="logits")
