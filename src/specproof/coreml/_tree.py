"""The MIL program of a tree verify (docs/coreml.md, "Trees"): every node of a token tree in one forward.

Inputs ``input_ids`` int32 ``[1, N]``, ``parents`` int32 ``[N]`` (``-1``: a child of the context; else an
earlier node) and ``position`` int32 ``[1]`` (the context length), the states of the chunk program read
and never written. The program derives everything from ``parents``: the ancestor matrix (each node's
root path), each node's depth and so its position, the tree attention mask. Per block:

- attention: node ``i`` attends to the cache below ``position`` and to its root path's keys placed at
  their positions (an exact 0/1 selection), so its scores are those of sequential decoding of the path;
- conv (LFM2 and the GDN's short conv): node ``i``'s window is gathered from its ancestors (then the
  conv state), never from the nodes before it in the flattened order;
- Gated DeltaNet: the delta rule unrolled over the nodes in order, node ``i`` continuing from its
  parent's state (the entry state for a root).

Outputs ``logits`` ``[1, N, vocab]`` and what the host needs to commit the winning path (the program
commits nothing): ``node_keys``/``node_values`` ``[n_attn, N, n_kv, head_dim]`` (each node's KV row),
``node_conv_state`` ``[N, *conv_state]`` and ``node_rec_state`` ``[N, *rec_state]`` (each node's states
after it). The host writes the winning path's KV rows at ``position + depth - 1`` and that node's states.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from specproof.coreml._blocks import (
    NEG,
    Graph,
    _delta_step,
    attn_projections,
    conv_block,
    fp16,
    gated_output,
    gdn_output,
    gdn_sequences,
    layer_stack,
    logits_head,
)
from specproof.coreml._options import ExportOptions
from specproof.coreml._program import KV_STATES, UNIFIED_KV, _rope_tables, _split_kv, check_exportable, state_shapes
from specproof.engine.targets.coreml import import_coremltools
from specproof.engine.targets.coreml_eval_tree import NODE_KEYS, NODE_STATE, NODE_VALUES, PARENTS
from specproof.engine.targets.reference import ReferenceHybrid

__all__ = ["build_tree_program"]

_I32 = np.int32


@attrs.define
class TreeGraph(Graph):
    """``Graph`` plus the tree's shared values: its size, ancestor matrix, conv windows, parent indices."""

    n: int = 0
    ancestors: Any = None  # [N, N] fp16: 1 where column j is row i or one of its ancestors
    windows: Any = None  # [N, conv_kernel] int32: each node's conv window as columns of [conv_state | nodes]
    parent_index: Any = None  # [N] int32: the parent, N for a root (the entry state's slot)
    node_cs: Any = None  # [N, *conv_state]
    node_rs: Any = None  # [N, *rec_state]
    keys: list[Any] = attrs.field(factory=list)
    values: list[Any] = attrs.field(factory=list)


def _ancestry(g: TreeGraph, parents: Any) -> tuple[Any, Any]:
    """(ancestor-or-self matrix ``[N, N]`` fp16, depth ``[N]`` int32) of ``parents``: ``A = I + P A`` N-1 times."""
    mb, n = g.mb, g.n
    child_of = mb.equal(x=mb.expand_dims(x=parents, axes=[1]), y=np.arange(n, dtype=_I32)[None, :])  # [N, N]
    one_hot = mb.cast(x=child_of, dtype="fp16")
    eye = fp16(np.eye(n))
    anc: Any = eye
    for _ in range(n - 1):
        anc = mb.add(x=eye, y=mb.matmul(x=one_hot, y=anc))
    depth = mb.cast(x=mb.reduce_sum(x=anc, axes=[1]), dtype="int32")
    return anc, depth


def _windows(g: TreeGraph, parents: Any, depth: Any) -> Any:
    """``[N, L]`` int32: node i's conv window, oldest first, as columns of ``[conv_state (L-1) | nodes (N)]``:
    its ancestors at distance L-1..1 (the conv state's newest columns past the root), then itself."""
    mb, n, width = g.mb, g.n, g.cfg.conv_kernel - 1
    ext = mb.concat(values=[parents, np.array([-1], _I32)], axis=0)  # [N + 1]: a root's parent stays -1
    nodes = np.arange(n, dtype=_I32)
    columns = [nodes + _I32(width)]  # distance 0: the node itself
    anc = parents
    for d in range(1, width + 1):
        in_state = mb.add(x=depth, y=np.int32(width - 1 - d))  # the conv state's column d - depth back
        columns.append(mb.select(cond=mb.less(x=anc, y=np.int32(0)), a=in_state, b=mb.add(x=anc, y=np.int32(width))))
        anc = mb.gather(x=ext, indices=mb.select(cond=mb.less(x=anc, y=np.int32(0)), a=np.int32(n), b=anc), axis=0)
    return mb.concat(values=[mb.expand_dims(x=c, axes=[1]) for c in columns[::-1]], axis=1)


def _prologue(g: TreeGraph, parents: Any, position: Any) -> None:
    mb, m, n = g.mb, g.cfg.max_context, g.n
    if g.opts.planted == "tree-as-chain":  # PLANTED BUG (tests only): every node the child of the one before
        parents = mb.add(x=np.zeros(n, _I32), y=np.arange(-1, n - 1, dtype=_I32))
    g.ancestors, depth = _ancestry(g, parents)
    g.position = position
    g.q = np.array([n], _I32)
    g.q_scalar = np.int32(n)
    g.rows = mb.add(x=mb.sub(x=depth, y=np.int32(1)), y=position)  # [N]: each node's absolute position
    g.mask = mb.less_equal(x=np.arange(m, dtype=_I32)[None, :], y=mb.expand_dims(x=g.rows, axes=[1]))  # [N, m]
    cos_table, sin_table = _rope_tables(g.cfg)
    g.cos = mb.expand_dims(x=mb.gather(x=cos_table, indices=g.rows, axis=0), axes=[0, 2])  # [1, N, 1, hd]
    g.sin = mb.expand_dims(x=mb.gather(x=sin_table, indices=g.rows, axis=0), axes=[0, 2])
    if g.opts.planted == "tree-conv-flattened":  # PLANTED BUG (tests only): the window of the flattened order
        chain = np.arange(-1, n - 1, dtype=_I32)
        g.windows = _windows(g, mb.add(x=np.zeros(n, _I32), y=chain), mb.add(x=chain, y=np.int32(2)))
    else:
        g.windows = _windows(g, parents, depth)
    g.parent_index = mb.select(cond=mb.less(x=parents, y=np.int32(0)), a=np.int32(n), b=parents)
    g.node_cs = mb.tile(x=mb.expand_dims(x=g.cs, axes=[0]), reps=[n, 1, 1, 1])
    if g.rs is not None:
        g.node_rs = mb.tile(x=mb.expand_dims(x=g.rs, axes=[0]), reps=[n, 1, 1, 1, 1])


def _tree_conv(g: TreeGraph, xin: Any, weight: np.ndarray, slot: int, channels: int) -> Any:
    """The depthwise conv of every node over its own window ``[N, C, L]``; the node's new window kept."""
    mb, n, width = g.mb, g.n, g.cfg.conv_kernel - 1
    hist = mb.slice_by_index(x=g.cs, begin=[slot, 0, 0], end=[slot + 1, channels, width])  # [1, C, L-1]
    ext = mb.concat(values=[hist, mb.transpose(x=xin, perm=[0, 2, 1])], axis=2)  # [1, C, L-1+N]
    window = mb.transpose(x=mb.reshape(x=mb.gather(x=ext, indices=g.windows, axis=2), shape=[channels, n, width + 1]),
                          perm=[1, 0, 2])  # fmt: skip
    out = mb.conv(x=window, weight=fp16(weight), groups=channels, pad_type="valid")  # [N, C, 1]
    kept = mb.slice_by_index(x=window, begin=[0, 0, 1], end=[n, channels, width + 1])  # [N, C, L-1]
    g.node_cs = mb.slice_update(
        x=g.node_cs, update=mb.expand_dims(x=kept, axes=[1]), begin=[0, slot, 0, 0], end=[n, slot + 1, channels, width]
    )
    return mb.reshape(x=out, shape=[1, n, channels])


def _tree_attn(g: TreeGraph, x: Any, p: str, slot: int, layer: int) -> Any:
    """Each node's attention over the cache below ``position`` and its root path's keys at their positions."""
    mb, cfg, n = g.mb, g.cfg, g.n
    hd, n_h, n_kv, m = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.max_context
    qh, kh, vh, gate = attn_projections(g, x, p, layer)  # [1, N, heads, hd]
    g.keys.append(kh)
    g.values.append(vh)
    # select[i, j, k] = 1 where node k is on node i's root path at position j: the path's rows, exactly
    at_row = mb.cast(
        x=mb.equal(x=np.arange(m, dtype=_I32)[:, None], y=mb.expand_dims(x=g.rows, axes=[0])), dtype="fp16"
    )
    select = mb.expand_dims(x=mb.mul(x=mb.expand_dims(x=g.ancestors, axes=[1]), y=at_row), axes=[1])  # [N,1,m,N]
    in_cache = mb.expand_dims(x=mb.less(x=np.arange(m, dtype=_I32), y=g.position), axes=[1])  # [m, 1]

    def per_node(cache: Any, rows: Any) -> Any:  # [N, n_kv, m, hd]: the cache, the path's rows above it
        own = mb.matmul(x=select, y=mb.expand_dims(x=mb.transpose(x=mb.reshape(x=rows, shape=[n, n_kv, hd]),
                                                                  perm=[1, 0, 2]), axes=[0]))  # fmt: skip
        layer_cache = mb.reshape(
            x=mb.slice_by_index(x=cache, begin=[slot, 0, 0, 0], end=[slot + 1, n_kv, m, hd]), shape=[1, n_kv, m, hd]
        )
        return mb.select(cond=in_cache, a=layer_cache, b=own)

    keys, values = per_node(g.kc, kh), per_node(g.vc, vh)
    group = n_h // n_kv
    s = mb.matmul(x=mb.reshape(x=qh, shape=[n, n_kv, group, hd]), y=keys, transpose_y=True)  # [N, kv, g, m]
    s = mb.select(cond=mb.expand_dims(x=g.mask, axes=[1, 2]), a=s, b=np.float16(NEG))
    o = mb.matmul(x=mb.softmax(x=s, axis=-1), y=values)  # [N, kv, g, hd]
    o = gated_output(g, mb.reshape(x=o, shape=[1, n, n_h * hd]), gate)
    return mb.linear(x=o, weight=g.W(p + "self_attn.out_proj.weight"))


def _tree_gdn(g: TreeGraph, x: Any, p: str, slot: int, rec_slot: int) -> Any:
    """Gated DeltaNet over the tree: the delta rule unrolled over the nodes, each from its parent's state."""
    mb, cfg, n = g.mb, g.cfg, g.n
    hg, dk, dv, cd = cfg.gdn_heads, cfg.gdn_key_dim, cfg.gdn_value_dim, cfg.gdn_conv_dim
    a = p + "linear_attn."
    qkv = mb.linear(x=x, weight=g.W(a + "in_proj_qkv.weight"))
    seq = gdn_sequences(g, x, p, mb.silu(x=_tree_conv(g, qkv, g.w[a + "conv1d.weight"], slot, cd)))
    entry = mb.slice_by_index(x=g.rs, begin=[rec_slot, 0, 0, 0], end=[rec_slot + 1, hg, dk, dv])
    states = mb.concat(values=[np.zeros((n, hg, dk, dv), np.float16), entry], axis=0)  # [N + 1]: the entry last
    outs = []
    for i in range(n):
        start = mb.gather(x=states, indices=mb.gather(x=g.parent_index, indices=np.int32(i), axis=0), axis=0)
        row = {key: mb.gather(x=val, indices=np.int32(i), axis=0) for key, val in seq.items()}
        new, o = _delta_step(g, start, row["k"], row["q"], row["v"], row["beta"], row["decay"])
        states = mb.slice_update(
            x=states, update=mb.expand_dims(x=new, axes=[0]), begin=[i, 0, 0, 0], end=[i + 1, hg, dk, dv]
        )
        outs.append(mb.expand_dims(x=o, axes=[0]))
    nodes = mb.slice_by_index(x=states, begin=[0, 0, 0, 0], end=[n, hg, dk, dv])
    g.node_rs = mb.slice_update(
        x=g.node_rs,
        update=mb.expand_dims(x=nodes, axes=[1]),
        begin=[0, rec_slot, 0, 0, 0],
        end=[n, rec_slot + 1, hg, dk, dv],
    )
    return gdn_output(g, x, p, mb.concat(values=outs, axis=0) if n > 1 else outs[0])


def _tree_blocks(g: TreeGraph, input_ids: Any) -> Any:
    mb = g.mb
    h = mb.gather(x=g.W("model.embed_tokens.weight"), indices=input_ids, axis=0)  # [1, N, d]
    h = layer_stack(
        g, h, conv=lambda g_, x, p, slot: conv_block(g_, x, p, slot, conv=_tree_conv), attn=_tree_attn, gdn=_tree_gdn
    )
    return logits_head(g, h)


def _node_rows(mb: Any, rows: list[Any], name: str) -> Any:
    """``[n_attn, N, n_kv, hd]`` from each attention block's ``[1, N, n_kv, hd]``."""
    return mb.concat(values=rows, axis=0, name=name) if len(rows) > 1 else mb.identity(x=rows[0], name=name)


def build_tree_program(target: ReferenceHybrid, *, nodes: int, options: ExportOptions | None = None) -> Any:
    """The MIL program (iOS 18 opset) of ``target``'s tree verify over exactly ``nodes`` nodes (module doc)."""
    ct = import_coremltools("Core ML export")
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program, types

    opts = ExportOptions() if options is None else options
    cfg = target.config
    check_exportable(cfg)
    shapes = state_shapes(cfg, layout=opts.layout)
    io_states = [] if opts.layout == "all-mlstate" else [n for n in shapes if n not in (*KV_STATES, UNIFIED_KV)]
    specs: dict[str, Any] = {
        "input_ids": mb.TensorSpec((1, nodes), dtype=types.int32),
        PARENTS: mb.TensorSpec((nodes,), dtype=types.int32),
        "position": mb.TensorSpec((1,), dtype=types.int32),
    }
    for name, shape in shapes.items():
        specs[name] = (mb.TensorSpec if name in io_states else mb.StateTensorSpec)(shape, dtype=types.fp16)
    g = TreeGraph(mb=mb, cfg=cfg, w=target.weights, opts=opts, max_query=nodes, n=nodes)
    with Function(specs, ct.target.iOS18) as func:
        inputs = func.inputs
        read = {n: inputs[n] if n in io_states else mb.read_state(input=inputs[n]) for n in shapes}
        if UNIFIED_KV in read:
            read["key_cache"], read["value_cache"] = _split_kv(mb, read[UNIFIED_KV], shapes[UNIFIED_KV])
        g.kc, g.vc, g.cs, g.rs = (read.get(n) for n in ("key_cache", "value_cache", "conv_state", "rec_state"))
        _prologue(g, inputs[PARENTS], inputs["position"])
        outputs = [_tree_blocks(g, inputs["input_ids"])]
        outputs.append(_node_rows(mb, g.keys, NODE_KEYS))
        outputs.append(_node_rows(mb, g.values, NODE_VALUES))
        outputs.append(mb.identity(x=g.node_cs, name=NODE_STATE.format("conv_state")))
        if g.node_rs is not None:
            outputs.append(mb.identity(x=g.node_rs, name=NODE_STATE.format("rec_state")))
        func.set_outputs(outputs)
    prog = Program()
    prog.add_function("main", func)
    return prog
