"""Export the reference target as a stateful Core ML ML program, and write golden greedy outputs.

The exported program computes ``ReferenceHybrid.forward`` for one chunk of tokens:

- inputs ``input_ids`` int32 ``[1, q]`` (``q`` a ``RangeDim(1, max_query)``) and
  ``position`` int32 ``[1]`` (the target's ``processed`` before this chunk);
- states, fp16 (the only state dtype Core ML allows), at full ``max_context``:
  ``key_cache``/``value_cache`` ``[n_attn, n_kv, max_context, head_dim]`` and
  ``conv_state`` ``[n_conv, conv_channels, conv_kernel - 1]`` — the shapes of
  ``ReferenceHybrid.state_arrays()`` (``rec_state`` is absent: see below);
- output ``logits`` float32 ``[1, q, vocab]`` (``[1, 1, vocab]`` for ``last_token_only``).

Weights are stored in fp16 under their Hugging Face layout (``linear`` takes
``[out, in]``, the depthwise ``conv`` takes ``[C, 1, L]``), so they can be compared
tensor by tensor with ``ReferenceHybrid.weights``. Compute is fp16 throughout (what
the Neural Engine runs); RMSNorm squares are taken after a cast to fp32 so that a
large residual cannot overflow fp16.

Supported: ``conv`` and ``attn`` blocks with a dense SwiGLU feed-forward. A ``gdn``
block (its delta rule is a sequential loop over the chunk) and a mixture-of-experts
feed-forward (data-dependent top-k routing) are refused with ``InvalidSettingError``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least
from specproof.engine.targets.coreml import import_coremltools
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid
from specproof.formats import golden as golden_format

__all__ = [
    "DEFAULT_EXPORT_TARGET",
    "DEFAULT_MAX_QUERY",
    "GOLDEN_FORMAT",
    "GOLDEN_PROMPTS",
    "ExportResult",
    "build_program",
    "check_exportable",
    "export_bundle",
    "export_config",
    "golden_cases",
    "write_golden",
]

DEFAULT_EXPORT_TARGET: Final = "reference:layers=conv+attn+conv+attn"
DEFAULT_MAX_QUERY: Final = 64
GOLDEN_FORMAT: Final = golden_format.ID
GOLDEN_MAX_NEW_TOKENS: Final = 32

# Fixed prompts for golden outputs: code, prose, a repetition, raw ids across the byte range.
GOLDEN_PROMPTS: Final[tuple[tuple[int, ...], ...]] = (
    tuple(b"def area(width, height):\n    return width * height\n\ndef area("),
    tuple(b"The quick brown fox jumps over the lazy dog. The quick brown"),
    tuple(b"abcabcabcabcabcabc"),
    (7,),
    (0, 255, 128, 64, 32, 16, 8, 4, 2, 1),
)

_NEG: Final = -30000.0  # masked attention score: exp underflows to exactly 0 in fp16, no inf arithmetic


def _coremltools() -> Any:
    return import_coremltools("Core ML export")


def check_exportable(config: ReferenceConfig) -> None:
    """Raise ``InvalidSettingError`` naming the first feature the exporter does not support."""
    if config.is_moe:
        raise InvalidSettingError(
            f"bundle export: the reference config has a mixture-of-experts feed-forward "
            f"(n_experts={config.n_experts}); "
            "only dense SwiGLU feed-forwards are exported (data-dependent top-k routing is not written in MIL)"
        )
    for i, kind in enumerate(config.layers):
        if kind == "gdn":
            raise InvalidSettingError(
                f"bundle export: layers[{i}] is a 'gdn' block; only 'conv' and 'attn' blocks are exported "
                "(the delta rule is a sequential loop over the chunk); use e.g. --target "
                f"'{DEFAULT_EXPORT_TARGET}'"
            )
    if config.n_attn_layers == 0 or config.n_conv_layers == 0:
        raise InvalidSettingError(
            f"bundle export: layers={'+'.join(config.layers)} needs at least one 'conv' and one 'attn' block "
            "(Core ML states cannot have a zero-sized dimension)"
        )


def _fp16(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float16)


def build_program(target: ReferenceHybrid, *, max_query: int, last_token_only: bool = False) -> Any:
    """The MIL program (iOS 18 opset) of ``target``'s forward over one chunk of 1..``max_query`` tokens."""
    ct = _coremltools()
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import get_new_symbol, types

    cfg = target.config
    check_exportable(cfg)
    w = target.weights
    d, hd, n_h, n_kv = cfg.d_model, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    group, m, width = n_h // n_kv, cfg.max_context, cfg.conv_kernel - 1
    eps = float(cfg.norm_eps)
    kv_shape = (cfg.n_attn_layers, n_kv, m, hd)
    conv_shape = (cfg.n_conv_layers, cfg.conv_channels, width)
    # RoPE tables as the reference builds them (float64 angles), stored in fp16
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    angles = np.arange(m, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate((angles, angles), axis=-1)
    cos_table, sin_table = _fp16(np.cos(emb)), _fp16(np.sin(emb))
    f16 = types.fp16
    i32 = np.int32

    def W(name: str) -> np.ndarray:
        return _fp16(w[name])

    def rms_norm(x: Any, weight: np.ndarray, name: str) -> Any:
        # mean(x^2) in fp32: fp16 squares overflow once |x| > 256
        x32 = mb.cast(x=x, dtype="fp32")
        ms = mb.reduce_mean(x=mb.mul(x=x32, y=x32), axes=[-1], keep_dims=True)
        inv = mb.cast(x=mb.rsqrt(x=ms, epsilon=eps), dtype="fp16")
        return mb.mul(x=mb.mul(x=x, y=inv), y=_fp16(weight), name=name)

    def linear(x: Any, weight: np.ndarray, name: str | None = None) -> Any:
        return mb.linear(x=x, weight=weight, name=name) if name else mb.linear(x=x, weight=weight)

    seq = get_new_symbol()

    @mb.program(
        input_specs=[
            mb.TensorSpec((1, seq), dtype=types.int32),
            mb.TensorSpec((1,), dtype=types.int32),
            mb.StateTensorSpec(kv_shape, dtype=f16),
            mb.StateTensorSpec(kv_shape, dtype=f16),
            mb.StateTensorSpec(conv_shape, dtype=f16),
        ],
        opset_version=ct.target.iOS18,
    )
    def prog(input_ids: Any, position: Any, key_cache: Any, value_cache: Any, conv_state: Any) -> Any:
        q = mb.slice_by_index(x=mb.shape(x=input_ids), begin=[1], end=[2])  # [1] int32: the chunk length
        end = mb.add(x=position, y=q)
        zero = np.array([0], i32)
        # absolute positions of the chunk's rows and the causal mask over the full cache
        rows = mb.add(x=mb.range_1d(start=0, end=mb.squeeze(x=q), step=1), y=position)  # [q]
        mask = mb.less_equal(
            x=mb.expand_dims(x=np.arange(m, dtype=i32), axes=[0]), y=mb.expand_dims(x=rows, axes=[1])
        )  # [q, m]: key j is visible to row i iff j <= position + i
        cos = mb.expand_dims(x=mb.gather(x=cos_table, indices=rows, axis=0), axes=[0, 2])  # [1, q, 1, hd]
        sin = mb.expand_dims(x=mb.gather(x=sin_table, indices=rows, axis=0), axes=[0, 2])
        kc = mb.read_state(input=key_cache)
        vc = mb.read_state(input=value_cache)
        cs = mb.read_state(input=conv_state)
        h = mb.gather(x=W("model.embed_tokens.weight"), indices=input_ids, axis=0)  # [1, q, d]
        n_attn = n_conv = 0
        for i, kind in enumerate(cfg.layers):
            p = f"model.layers.{i}."
            x = rms_norm(h, w[p + "operator_norm.weight"], f"layer{i}_operator_norm")
            if kind == "conv":
                bcx = linear(x, W(p + "conv.in_proj.weight"))  # [1, q, 3d]: B, C, x
                b_ = mb.slice_by_index(x=bcx, begin=[0, 0, 0], end=[1, 0, d], end_mask=[True, True, False])
                c_ = mb.slice_by_index(x=bcx, begin=[0, 0, d], end=[1, 0, 2 * d], end_mask=[True, True, False])
                x_ = mb.slice_by_index(x=bcx, begin=[0, 0, 2 * d], end=[1, 0, 3 * d], end_mask=[True, True, False])
                bx = mb.transpose(x=mb.mul(x=b_, y=x_), perm=[0, 2, 1])  # [1, d, q]
                hist = mb.slice_by_index(x=cs, begin=[n_conv, 0, 0], end=[n_conv + 1, d, width])  # [1, d, L-1]
                full = mb.concat(values=[hist, bx], axis=2)  # [1, d, L-1+q], oldest first
                conv = mb.conv(x=full, weight=W(p + "conv.conv.weight"), groups=d, pad_type="valid")  # [1, d, q]
                new_hist = mb.slice_by_index(x=full, begin=[0, 0, -width], end=[1, d, 0], end_mask=[False, False, True])
                cs = mb.slice_update(x=cs, update=new_hist, begin=[n_conv, 0, 0], end=[n_conv + 1, d, width])
                y = mb.mul(x=c_, y=mb.transpose(x=conv, perm=[0, 2, 1]))
                h = mb.add(x=h, y=linear(y, W(p + "conv.out_proj.weight")))
                n_conv += 1
            else:
                a = p + "self_attn."
                qh = mb.reshape(x=linear(x, W(a + "q_proj.weight")), shape=[1, -1, n_h, hd])
                kh = mb.reshape(x=linear(x, W(a + "k_proj.weight")), shape=[1, -1, n_kv, hd])
                vh = mb.reshape(x=linear(x, W(a + "v_proj.weight")), shape=[1, -1, n_kv, hd])
                qh = rms_norm(qh, w[a + "q_layernorm.weight"], f"layer{i}_q_layernorm")
                kh = rms_norm(kh, w[a + "k_layernorm.weight"], f"layer{i}_k_layernorm")

                def rope(t: Any) -> Any:
                    t1 = mb.slice_by_index(
                        x=t, begin=[0, 0, 0, 0], end=[1, 0, 0, hd // 2], end_mask=[True, True, True, False]
                    )
                    t2 = mb.slice_by_index(
                        x=t, begin=[0, 0, 0, hd // 2], end=[1, 0, 0, hd], end_mask=[True, True, True, False]
                    )
                    rot = mb.concat(values=[mb.mul(x=t2, y=np.float16(-1.0)), t1], axis=3)  # rotate_half
                    return mb.add(x=mb.mul(x=t, y=cos), y=mb.mul(x=rot, y=sin))

                qh = mb.mul(x=rope(qh), y=np.float16(1.0 / math.sqrt(hd)))
                kh = rope(kh)
                begin = mb.concat(values=[np.array([n_attn, 0], i32), position, zero], axis=0)
                stop = mb.concat(values=[np.array([n_attn + 1, n_kv], i32), end, np.array([hd], i32)], axis=0)
                kc = mb.slice_update(x=kc, update=mb.transpose(x=kh, perm=[0, 2, 1, 3]), begin=begin, end=stop)
                vc = mb.slice_update(x=vc, update=mb.transpose(x=vh, perm=[0, 2, 1, 3]), begin=begin, end=stop)
                keys = mb.reshape(
                    x=mb.slice_by_index(x=kc, begin=[n_attn, 0, 0, 0], end=[n_attn + 1, n_kv, m, hd]),
                    shape=[n_kv, m, hd],
                )
                values = mb.reshape(
                    x=mb.slice_by_index(x=vc, begin=[n_attn, 0, 0, 0], end=[n_attn + 1, n_kv, m, hd]),
                    shape=[n_kv, m, hd],
                )
                # heads h = kv * group + g, as the reference groups them; rows ordered (g, position)
                qg = mb.reshape(x=mb.transpose(x=qh, perm=[0, 2, 1, 3]), shape=[n_kv, -1, hd])  # [kv, g*q, hd]
                s = mb.reshape(x=mb.matmul(x=qg, y=keys, transpose_y=True), shape=[n_kv, group, -1, m])
                s = mb.select(cond=mask, a=s, b=np.float16(_NEG))
                o = mb.matmul(x=mb.reshape(x=mb.softmax(x=s, axis=-1), shape=[n_kv, -1, m]), y=values)
                o = mb.transpose(x=mb.reshape(x=o, shape=[n_kv, group, -1, hd]), perm=[2, 0, 1, 3])  # [q, kv, g, hd]
                o = mb.reshape(x=o, shape=[1, -1, n_h * hd])
                h = mb.add(x=h, y=linear(o, W(a + "out_proj.weight")))
                n_attn += 1
            x = rms_norm(h, w[p + "ffn_norm.weight"], f"layer{i}_ffn_norm")
            gate = mb.silu(x=linear(x, W(p + "feed_forward.w1.weight")))
            up = linear(x, W(p + "feed_forward.w3.weight"))
            h = mb.add(x=h, y=linear(mb.mul(x=gate, y=up), W(p + "feed_forward.w2.weight")))
        mb.coreml_update_state(state=key_cache, value=kc)
        mb.coreml_update_state(state=value_cache, value=vc)
        mb.coreml_update_state(state=conv_state, value=cs)
        if last_token_only:
            h = mb.slice_by_index(x=h, begin=[0, -1, 0], end=[1, 0, d], end_mask=[True, True, True])
        x = rms_norm(h, w["model.embedding_norm.weight"], "final_norm")
        head = w["model.embed_tokens.weight"] if cfg.tie_embeddings else w["lm_head.weight"]
        return mb.cast(x=linear(x, _fp16(head)), dtype="fp32", name="logits")

    return prog


@attrs.frozen(kw_only=True)
class ExportResult:
    """What ``export_bundle`` wrote: the path, its size on disk and the build time."""

    path: Path
    target_spec: str
    config: ReferenceConfig
    max_query: int
    last_token_only: bool
    bytes: int
    seconds: float


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def export_bundle(
    path: str | Path,
    target: ReferenceHybrid,
    *,
    k: int = 4,
    max_query: int | None = None,
    last_token_only: bool = False,
    target_spec: str = "",
) -> ExportResult:
    """Write ``target`` as a stateful ``.mlpackage`` at ``path`` (iOS 18 / macOS 15); return what was written.

    ``max_query`` (default ``max(k + 1, 64)``) is the upper bound of the token input's
    length; it must be at least ``k + 1`` so one forward verifies ``k`` draft tokens.
    """
    int_at_least(k, name="k", minimum=1, where="bundle export")
    mq = max(k + 1, DEFAULT_MAX_QUERY) if max_query is None else max_query
    if isinstance(mq, bool) or not isinstance(mq, int) or mq < k + 1:
        raise InvalidSettingError(f"bundle export: max_query={mq!r} must be an integer >= k + 1 = {k + 1}")
    if not isinstance(target, ReferenceHybrid):
        raise InvalidSettingError(
            f"bundle export: the target must be a ReferenceHybrid (a reference spec), got {type(target).__name__}"
        )
    if mq > target.max_context:
        raise InvalidSettingError(
            f"bundle export: max_query={mq} exceeds the target's max_context={target.max_context}"
        )
    out = Path(path)
    if out.suffix != ".mlpackage":
        raise InvalidSettingError(f"bundle export: {str(out)!r} must end in .mlpackage")
    ct = _coremltools()
    t0 = time.perf_counter()
    prog = build_program(target, max_query=mq, last_token_only=last_token_only)
    cfg = target.config
    model = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        # the program is already fp16 where it should be; FLOAT32 keeps the converter from re-casting it
        compute_precision=ct.precision.FLOAT32,
        inputs=[
            ct.TensorType(name="input_ids", shape=(1, ct.RangeDim(1, mq, default=1)), dtype=np.int32),
            ct.TensorType(name="position", shape=(1,), dtype=np.int32),
        ],
        skip_model_load=True,
    )
    model.short_description = f"specproof export of {target.describe()}; verify forwards of up to {mq} tokens" + (
        "; LAST-TOKEN-ONLY logits (does not qualify for verify)" if last_token_only else ""
    )
    model.user_defined_metadata["specproof.target"] = target_spec or "reference"
    model.user_defined_metadata["specproof.max_context"] = str(cfg.max_context)
    model.user_defined_metadata["specproof.vocab_size"] = str(cfg.vocab_size)
    model.user_defined_metadata["specproof.max_query"] = str(mq)
    model.user_defined_metadata["specproof.last_token_only"] = str(bool(last_token_only)).lower()
    model.save(str(out))
    return ExportResult(
        path=out,
        target_spec=target_spec or "reference",
        config=cfg,
        max_query=mq,
        last_token_only=last_token_only,
        bytes=_dir_bytes(out),
        seconds=time.perf_counter() - t0,
    )


def golden_cases(
    target: Any, *, prompts: Sequence[Sequence[int]] = GOLDEN_PROMPTS, max_new_tokens: int = GOLDEN_MAX_NEW_TOKENS
) -> list[dict[str, Any]]:
    """Greedy continuations of ``prompts`` on ``target`` (the oracle), as golden-file cases."""
    from specproof.engine import greedy_decode

    cases = []
    for prompt in prompts:
        bad = [t for t in prompt if not 0 <= t < target.vocab_size]
        if bad:
            raise InvalidSettingError(
                f"golden prompt {list(prompt)[:8]}...: id {bad[0]} is outside [0, {target.vocab_size})"
            )
        gen = greedy_decode(target, list(prompt), max_new_tokens, eos_token_id=None)
        cases.append(
            {"prompt": list(prompt), "max_new_tokens": max_new_tokens, "eos_token_id": None, "tokens": list(gen.tokens)}
        )
    return cases


def write_golden(path: str | Path, target: Any, *, target_spec: str, **options: Any) -> dict[str, Any]:
    """Write a golden file (``specproof.formats.golden``) of greedy tokens on ``target``; return the document."""
    doc = {"format": GOLDEN_FORMAT, "target": target_spec, "cases": golden_cases(target, **options)}
    # one case per line: diffs of a regenerated file show which prompt changed
    golden_format.FORMAT_ONE_CASE_PER_LINE.write(path, doc)
    return doc


def export_config(config: ReferenceConfig, *, max_context: int | None) -> ReferenceConfig:
    """``config`` with ``max_context`` replaced (the weights do not depend on it)."""
    return config if max_context is None else attrs.evolve(config, max_context=max_context)
