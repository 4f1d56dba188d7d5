"""The MIL program of ``ReferenceHybrid.forward`` over one chunk, in either state layout.

Inputs ``input_ids`` int32 ``[1, q]`` (``q`` symbolic, ``RangeDim(1, max_query)`` at
conversion) and ``position`` int32 ``[1]`` (or, ``positions="seed"``, ``position_ids`` int32
``[1, processed + q]``: ``_positions.py``); fp16 states at full ``max_context``, the
shapes of ``ReferenceHybrid.state_arrays()``: ``key_cache``/``value_cache``
``[n_attn, n_kv, max_context, head_dim]``, ``conv_state`` ``[n_conv + n_gdn, channels,
conv_kernel - 1]`` and ``rec_state`` ``[n_gdn, gdn_heads, key_dim, value_dim]`` (each only
when a block has it: Core ML states cannot have a zero-sized dimension). Layout
``all-mlstate`` makes every one a Core ML state; ``kv-mlstate`` keeps the KV cache as
states and passes ``conv_state``/``rec_state`` as inputs returned as ``conv_state_out``/
``rec_state_out``. Output ``logits`` float32 ``[1, q, vocab]`` (``[1, 1, vocab]`` for
``last_token_only``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.coreml._blocks import Graph, attn_block, conv_block, fp16, gdn_block, layer_stack, logits_head
from specproof.coreml._options import ExportOptions
from specproof.coreml._positions import chunk_positions, position_specs
from specproof.engine.targets.coreml import import_coremltools
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid

__all__ = ["KV_STATES", "UNIFIED_KV", "build_program", "check_exportable", "state_shapes"]

KV_STATES = ("key_cache", "value_cache")
UNIFIED_KV = "kv_cache"  # the unified-kv layout's one KV state: [2, n_attn, n_kv, max_context, head_dim]


def check_exportable(config: ReferenceConfig) -> None:
    """Raise ``InvalidSettingError`` naming the first feature of ``config`` the exporter cannot write."""
    if config.n_attn_layers == 0 or config.n_conv_layers == 0:
        raise InvalidSettingError(
            f"bundle export: layers={'+'.join(config.layers)} needs at least one 'attn' block and one 'conv' or "
            "'gdn' block (Core ML states cannot have a zero-sized dimension)"
        )
    if config.conv_kernel < 2:
        raise InvalidSettingError(
            f"bundle export: conv_kernel={config.conv_kernel} leaves conv_state zero-sized; it must be >= 2"
        )


def state_shapes(cfg: ReferenceConfig, *, layout: str = "all-mlstate") -> dict[str, tuple[int, ...]]:
    """The fp16 state tensors of an export of ``cfg``, in order (``rec_state`` only with GDN blocks); the
    ``unified-kv`` layout holds keys and values in one ``kv_cache`` ``[2, ...]`` (keys first)."""
    kv = (cfg.n_attn_layers, cfg.n_kv_heads, cfg.max_context, cfg.head_dim)
    caches = {UNIFIED_KV: (2, *kv)} if layout == "unified-kv" else {"key_cache": kv, "value_cache": kv}
    out = {
        **caches,
        "conv_state": (cfg.n_conv_layers, cfg.conv_channels, cfg.conv_kernel - 1),
    }
    if cfg.n_gdn_layers:
        out["rec_state"] = (cfg.n_gdn_layers, cfg.gdn_heads, cfg.gdn_key_dim, cfg.gdn_value_dim)
    return out


def _rope_tables(cfg: ReferenceConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin for every position, as the reference builds them (float64 angles), stored in fp16."""
    hd = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    angles = np.arange(cfg.max_context, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate((angles, angles), axis=-1)
    return fp16(np.cos(emb)), fp16(np.sin(emb))


def _prologue(g: Graph, inputs: Any) -> None:
    """The chunk's length, row positions (from either position layout), causal mask and RoPE rows."""
    mb, m = g.mb, g.cfg.max_context
    g.q = mb.slice_by_index(x=mb.shape(x=inputs["input_ids"]), begin=[1], end=[2])  # [1] int32
    g.q_scalar = mb.squeeze(x=g.q)
    g.position, rows = chunk_positions(mb, inputs, g.q, planted=g.opts.planted)
    g.rows = mb.add(x=mb.range_1d(start=0, end=g.q_scalar, step=1), y=g.position) if rows is None else rows  # [q]
    g.mask = mb.less_equal(
        x=mb.expand_dims(x=np.arange(m, dtype=np.int32), axes=[0]), y=mb.expand_dims(x=g.rows, axes=[1])
    )  # [q, m]: key j is visible to row i iff j <= position + i
    cos_table, sin_table = _rope_tables(g.cfg)
    g.cos = mb.expand_dims(x=mb.gather(x=cos_table, indices=g.rows, axis=0), axes=[0, 2])  # [1, q, 1, hd]
    g.sin = mb.expand_dims(x=mb.gather(x=sin_table, indices=g.rows, axis=0), axes=[0, 2])


def _blocks(g: Graph, input_ids: Any) -> Any:
    """Embedding, every block with its feed-forward, final norm and head: the logits."""
    mb, cfg = g.mb, g.cfg
    h = mb.gather(x=g.W("model.embed_tokens.weight"), indices=input_ids, axis=0)  # [1, q, d]
    h = layer_stack(g, h, conv=conv_block, attn=attn_block, gdn=gdn_block)
    if g.opts.last_token_only:
        h = mb.slice_by_index(x=h, begin=[0, -1, 0], end=[1, 0, cfg.d_model], end_mask=[True, True, True])
    return logits_head(g, h)


def _split_kv(mb: Any, kv: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """The keys and the values of a unified ``kv_cache`` ``[2, ...]``."""
    rest = list(shape[1:])
    halves = (mb.slice_by_index(x=kv, begin=[i, 0, 0, 0, 0], end=[i + 1, *rest]) for i in (0, 1))
    keys, values = (mb.reshape(x=h, shape=rest) for h in halves)
    return keys, values


def build_program(
    target: ReferenceHybrid, *, max_query: int, options: ExportOptions | None = None, fixed_query: int | None = None
) -> Any:
    """The MIL program (iOS 18 opset) of ``target``'s forward over one chunk of 1..``max_query`` tokens
    (exactly ``fixed_query`` tokens when given: a fixed-shape function of a multifunction bundle)."""
    ct = import_coremltools("Core ML export")
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program, get_new_symbol, types

    opts = ExportOptions() if options is None else options
    cfg = target.config
    check_exportable(cfg)
    shapes = state_shapes(cfg, layout=opts.layout)
    io_states = [] if opts.layout == "all-mlstate" else [n for n in shapes if n not in (*KV_STATES, UNIFIED_KV)]
    specs: dict[str, Any] = {
        "input_ids": mb.TensorSpec((1, fixed_query or get_new_symbol()), dtype=types.int32),
        **position_specs(mb, types, get_new_symbol, positions=opts.positions),
    }
    for name, shape in shapes.items():
        spec = mb.TensorSpec if name in io_states else mb.StateTensorSpec
        specs[name] = spec(shape, dtype=types.fp16)
    g = Graph(mb=mb, cfg=cfg, w=target.weights, opts=opts, max_query=max_query)
    with Function(specs, ct.target.iOS18) as func:
        inputs = func.inputs
        read = {n: inputs[n] if n in io_states else mb.read_state(input=inputs[n]) for n in shapes}
        if UNIFIED_KV in read:
            read["key_cache"], read["value_cache"] = _split_kv(mb, read[UNIFIED_KV], shapes[UNIFIED_KV])
        g.kc, g.vc, g.cs, g.rs = (read.get(n) for n in ("key_cache", "value_cache", "conv_state", "rec_state"))
        _prologue(g, inputs)
        logits = _blocks(g, inputs["input_ids"])
        final = {"key_cache": g.kc, "value_cache": g.vc, "conv_state": g.cs, "rec_state": g.rs}
        if UNIFIED_KV in read:
            final[UNIFIED_KV] = mb.concat(
                values=[mb.expand_dims(x=g.kc, axes=[0]), mb.expand_dims(x=g.vc, axes=[0])], axis=0
            )
        outputs = [logits]
        for name in shapes:
            if name in io_states:
                value = final[name]
                if value is inputs[name]:  # not written back (a planted bug): pass the input through
                    value = mb.identity(x=value)
                outputs.append(mb.identity(x=value, name=f"{name}_out"))
            elif final[name] is not read[name]:
                mb.coreml_update_state(state=inputs[name], value=final[name])
        func.set_outputs(outputs)
    prog = Program()
    prog.add_function("main", func)
    return prog
