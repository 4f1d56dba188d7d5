"""The reference target: a small hybrid language model in numpy, exactly batch-invariant.

``ReferenceHybrid`` mixes three block kinds, each a pre-norm residual block followed
by a SwiGLU (or mixture-of-experts) feed-forward:

- ``conv``: LFM2's gated short convolution (``B, C, x = in_proj(h)``; ``C * conv(B * x)``);
- ``attn``: grouped-query attention with RoPE and per-head QK RMSNorm (as LFM2);
- ``gdn``: a Gated DeltaNet block (as Qwen3-Next / Qwen3.5, same parameter names).

It holds the four device states of an exported bundle, preallocated in float32:
``key_cache``/``value_cache`` (append-only, ``max_context`` slots), ``conv_state``
(the last ``conv_kernel - 1`` inputs of every short convolution) and ``rec_state``
(the delta-rule matrices). Weight names follow Hugging Face ``Lfm2ForCausalLM``
(and ``Qwen3_5GatedDeltaNet`` for the ``gdn`` blocks), so trained weights can be
moved between this target, mlx-lm and transformers.

**Exact batch invariance.** A ``[q, d] @ [d, v]`` BLAS product is not row-invariant,
and neither is a sum whose length depends on ``q``. So every row goes through the
same calls whatever ``q`` is: projections are stacked ``[1, d] @ [d, v]`` products
(one identical BLAS call per row), reductions run along the contiguous last axis of
per-row arrays, the conv taps are summed elementwise in a fixed order, transcendental
functions only see fresh contiguous arrays, and an attention row over ``n`` keys sums
over ``key_width(n)`` cache slots (``n`` rounded up to 64; the slots past ``n`` weighted
``exp(-inf) == 0``) with per-row ``[group, hd] @ [hd, width]`` and ``[group, width] @
[width, hd]`` products: the shapes of a one-token forward at that position, so the rows
of one width share one batched call. The delta-rule recurrence is a per-token loop
anyway. Hence one forward of q tokens returns, bit for bit, the rows of q one-token
forwards (and of any other chunking); only a nan's sign bit may differ, as numpy's vector
``exp`` does not keep it across array lengths.

Copies (``copy.deepcopy``) share the read-only weights and copy the states; a copy is
another instance, so it refuses the original's snapshots.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs
import numpy as np
import numpy.typing as npt

from specproof.contract.compare import arrays_differ
from specproof.contract.errors import (
    CapacityError,
    InvalidSettingError,
    StaleSnapshotError,
    TargetContractError,
    TokenRangeError,
)
from specproof.contract.validation import int_at_least
from specproof.engine.targets._reference_blocks import (
    AttnBlock,
    Block,
    ConvBlock,
    GdnBlock,
    MoeFfn,
    _linear,
    _rms_norm,
    build_ffn,
    key_width,
    rope_tables,
)
from specproof.engine.targets._reference_blocks import _silu as _silu  # re-exported for engine.drafters.heads
from specproof.engine.targets._reference_routers import ROUTERS
from specproof.engine.targets._reference_tree import tree_forward

__all__ = [
    "BLOCK_KINDS",
    "ReferenceConfig",
    "ReferenceHybrid",
    "ReferenceSnapshot",
    "default_config",
    "moe_config",
]

FloatArray = npt.NDArray[np.float32]
_Arr = npt.NDArray[Any]

BLOCK_KINDS: Final[tuple[str, ...]] = ("conv", "attn", "gdn")
_DEFAULT_LAYERS: Final[tuple[str, ...]] = ("conv", "attn", "conv", "gdn", "conv", "attn")
_F32 = np.float32


# --------------------------------------------------------------------------- config


def _to_layers(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise InvalidSettingError(
            f"ReferenceConfig.layers={value!r} must be a tuple of block kinds such as ('conv', 'attn'), not a string"
        )
    try:
        return tuple(value)
    except TypeError:
        raise InvalidSettingError(f"ReferenceConfig.layers={value!r} must be a tuple of block kinds") from None


def _check_positive_float(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.floating, np.integer))
        or not math.isfinite(float(value))
        or float(value) <= 0.0
    ):
        raise InvalidSettingError(f"ReferenceConfig.{name}={value!r} must be a finite number > 0")


def _check_moe_features(cfg: ReferenceConfig) -> None:
    """The router is a known one, and the MoE-only features come with experts."""
    if cfg.router not in ROUTERS:
        raise InvalidSettingError(f"ReferenceConfig.router={cfg.router!r}; one of {', '.join(ROUTERS)}")
    for name, on in (("router", cfg.router != "softmax"), ("shared_expert", cfg.shared_expert)):
        if on and not cfg.n_experts:
            raise InvalidSettingError(
                f"ReferenceConfig.{name}={getattr(cfg, name)!r} needs a mixture of experts (n_experts > 0)"
            )


@attrs.frozen(kw_only=True)
class ReferenceConfig:
    """Sizes and seed of a ``ReferenceHybrid`` (validated on construction).

    ``layers`` lists the block kinds in order (``"conv"``, ``"attn"``, ``"gdn"``).
    ``conv_kernel`` is the short-conv length ``L_cache``, shared by the LFM2 conv
    blocks and the GDN's own convolution. ``n_experts == 0`` gives a dense SwiGLU
    feed-forward; ``n_experts > 0`` a top-``experts_per_token`` mixture of experts
    in every block. ``init_scale`` scales the seeded random projections.

    Real-model features, all off by default (docs/coreml.md, "The families"): ``router`` ``"softmax"`` or
    ``"sigmoid"`` (LFM2-MoE: sigmoid scores, a per-expert ``expert_bias`` added for the selection only);
    ``shared_expert`` (Qwen3-Next: a SwiGLU expert every row runs, scaled by ``sigmoid(shared_expert_gate(x))``);
    ``attn_output_gate`` (Qwen3-Next: ``q_proj`` also gives a per-head gate, ``sigmoid`` applied before
    ``out_proj``). ``_reference_routers`` and ``_reference_blocks`` say how each is computed.
    """

    vocab_size: int = 256
    d_model: int = 64
    layers: tuple[str, ...] = attrs.field(default=_DEFAULT_LAYERS, converter=_to_layers)
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn_dim: int = 128
    conv_kernel: int = 3
    gdn_heads: int = 2
    gdn_key_dim: int = 16
    gdn_value_dim: int = 16
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_context: int = 4096
    n_experts: int = 0
    experts_per_token: int = 2
    expert_ffn_dim: int = 64
    seed: int = 0
    init_scale: float = 2.0
    tie_embeddings: bool = True
    router: str = "softmax"
    shared_expert: bool = False
    attn_output_gate: bool = False

    def __attrs_post_init__(self) -> None:
        for name in (
            "vocab_size",
            "d_model",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "ffn_dim",
            "conv_kernel",
            "gdn_heads",
            "gdn_key_dim",
            "gdn_value_dim",
            "max_context",
            "experts_per_token",
            "expert_ffn_dim",
        ):
            int_at_least(getattr(self, name), name=f"ReferenceConfig.{name}", minimum=1)
        int_at_least(self.n_experts, name="ReferenceConfig.n_experts", minimum=0)
        int_at_least(self.seed, name="ReferenceConfig.seed", minimum=0)
        for name in ("rope_theta", "norm_eps", "init_scale"):
            _check_positive_float(name, getattr(self, name))
        for name in ("tie_embeddings", "shared_expert", "attn_output_gate"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InvalidSettingError(f"ReferenceConfig.{name}={getattr(self, name)!r} must be a bool")
        _check_moe_features(self)
        if not self.layers:
            raise InvalidSettingError("ReferenceConfig.layers=() must name at least one block")
        for i, kind in enumerate(self.layers):
            if kind not in BLOCK_KINDS:
                raise InvalidSettingError(
                    f"ReferenceConfig.layers[{i}]={kind!r} is not a block kind; known: {', '.join(BLOCK_KINDS)}"
                )
        if self.n_heads % self.n_kv_heads:
            raise InvalidSettingError(
                f"ReferenceConfig.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}"
            )
        if self.head_dim % 2:
            raise InvalidSettingError(f"ReferenceConfig.head_dim={self.head_dim} must be even (RoPE rotates halves)")
        if self.n_experts and self.experts_per_token > self.n_experts:
            raise InvalidSettingError(
                f"ReferenceConfig.experts_per_token={self.experts_per_token} must be <= n_experts={self.n_experts}"
            )

    @property
    def is_moe(self) -> bool:
        """Whether the feed-forwards are mixtures of experts."""
        return self.n_experts > 0

    @property
    def n_attn_layers(self) -> int:
        return sum(kind == "attn" for kind in self.layers)

    @property
    def n_gdn_layers(self) -> int:
        return sum(kind == "gdn" for kind in self.layers)

    @property
    def n_conv_layers(self) -> int:
        """Blocks with a short convolution (``conv`` and ``gdn``): the rows of ``conv_state``."""
        return sum(kind != "attn" for kind in self.layers)

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of the GDN's short convolution: ``concat(q, k, v)``."""
        return self.gdn_heads * (2 * self.gdn_key_dim + self.gdn_value_dim)

    @property
    def conv_channels(self) -> int:
        """Width of ``conv_state``: the widest short convolution (narrower ones are zero-padded)."""
        widths = [self.d_model if kind == "conv" else self.gdn_conv_dim for kind in self.layers if kind != "attn"]
        return max(widths, default=0)


def default_config() -> ReferenceConfig:
    """The seeded default: 6 blocks (conv, attn, conv, gdn, conv, attn), d_model 64, byte vocabulary."""
    return ReferenceConfig()


def moe_config() -> ReferenceConfig:
    """The default with a mixture-of-experts feed-forward (8 experts, top-2, 64 wide) in every block."""
    return ReferenceConfig(n_experts=8, experts_per_token=2, expert_ffn_dim=64)


# --------------------------------------------------------------------------- weights

# init kinds: "embed" N(0, 1); "linear" N(0, (init_scale / sqrt(fan_in))^2); "conv" the same with
# fan_in = kernel length; "ones"; "a_log" log U(1, 8); "dt_bias" U(-1, 1); "expert_bias" U(-1, 1).
_Spec = tuple[str, tuple[int, ...], str]


def _weight_specs(cfg: ReferenceConfig) -> list[_Spec]:
    """Every tensor of the model, in HF naming and creation (seeding) order."""
    d, L = cfg.d_model, cfg.conv_kernel
    specs: list[_Spec] = [("model.embed_tokens.weight", (cfg.vocab_size, d), "embed")]
    for i, kind in enumerate(cfg.layers):
        p = f"model.layers.{i}."
        specs.append((p + "operator_norm.weight", (d,), "ones"))
        if kind == "conv":
            specs += [
                (p + "conv.in_proj.weight", (3 * d, d), "linear"),
                (p + "conv.conv.weight", (d, 1, L), "conv"),
                (p + "conv.out_proj.weight", (d, d), "linear"),
            ]
        elif kind == "attn":
            hd = cfg.head_dim
            gated = 2 if cfg.attn_output_gate else 1  # each head's query, then its output gate
            specs += [
                (p + "self_attn.q_proj.weight", (gated * cfg.n_heads * hd, d), "linear"),
                (p + "self_attn.k_proj.weight", (cfg.n_kv_heads * hd, d), "linear"),
                (p + "self_attn.v_proj.weight", (cfg.n_kv_heads * hd, d), "linear"),
                (p + "self_attn.out_proj.weight", (d, cfg.n_heads * hd), "linear"),
                (p + "self_attn.q_layernorm.weight", (hd,), "ones"),
                (p + "self_attn.k_layernorm.weight", (hd,), "ones"),
            ]
        else:
            hg, dv = cfg.gdn_heads, cfg.gdn_value_dim
            specs += [
                (p + "linear_attn.in_proj_qkv.weight", (cfg.gdn_conv_dim, d), "linear"),
                (p + "linear_attn.in_proj_z.weight", (hg * dv, d), "linear"),
                (p + "linear_attn.in_proj_b.weight", (hg, d), "linear"),
                (p + "linear_attn.in_proj_a.weight", (hg, d), "linear"),
                (p + "linear_attn.conv1d.weight", (cfg.gdn_conv_dim, 1, L), "conv"),
                (p + "linear_attn.A_log", (hg,), "a_log"),
                (p + "linear_attn.dt_bias", (hg,), "dt_bias"),
                (p + "linear_attn.norm.weight", (dv,), "ones"),
                (p + "linear_attn.out_proj.weight", (d, hg * dv), "linear"),
            ]
        specs.append((p + "ffn_norm.weight", (d,), "ones"))
        if cfg.is_moe:
            f = cfg.expert_ffn_dim
            specs.append((p + "feed_forward.gate.weight", (cfg.n_experts, d), "linear"))
            for e in range(cfg.n_experts):
                q = f"{p}feed_forward.experts.{e}."
                specs += [
                    (q + "w1.weight", (f, d), "linear"),
                    (q + "w3.weight", (f, d), "linear"),
                    (q + "w2.weight", (d, f), "linear"),
                ]
            specs += _moe_feature_specs(cfg, p)
        else:
            f = cfg.ffn_dim
            specs += [
                (p + "feed_forward.w1.weight", (f, d), "linear"),
                (p + "feed_forward.w3.weight", (f, d), "linear"),
                (p + "feed_forward.w2.weight", (d, f), "linear"),
            ]
    specs.append(("model.embedding_norm.weight", (d,), "ones"))
    if not cfg.tie_embeddings:
        specs.append(("lm_head.weight", (cfg.vocab_size, d), "linear"))
    return specs


def _moe_feature_specs(cfg: ReferenceConfig, p: str) -> list[_Spec]:
    """The sigmoid router's ``expert_bias`` and the shared expert with its gate, where the config has them."""
    d, f = cfg.d_model, cfg.expert_ffn_dim
    specs: list[_Spec] = []
    if cfg.router == "sigmoid":
        specs.append((p + "feed_forward.expert_bias", (cfg.n_experts,), "expert_bias"))
    if cfg.shared_expert:
        s = p + "feed_forward.shared_expert."
        specs += [(s + "w1.weight", (f, d), "linear"), (s + "w3.weight", (f, d), "linear")]
        specs += [(s + "w2.weight", (d, f), "linear"), (p + "feed_forward.shared_expert_gate.weight", (1, d), "linear")]
    return specs


def _init_weights(cfg: ReferenceConfig) -> dict[str, FloatArray]:
    rng = np.random.default_rng(cfg.seed)
    out: dict[str, FloatArray] = {}
    for name, shape, kind in _weight_specs(cfg):
        if kind == "ones":
            value = np.ones(shape)
        elif kind == "embed":
            value = rng.standard_normal(shape)
        elif kind in ("linear", "conv"):
            value = rng.standard_normal(shape) * (cfg.init_scale / math.sqrt(shape[-1]))
        elif kind == "a_log":
            value = np.log(rng.uniform(1.0, 8.0, shape))
        elif kind == "expert_bias":  # as wide as the sigmoid scores' range, so it changes many selections
            value = rng.uniform(-1.0, 1.0, shape)
        else:  # dt_bias
            value = rng.uniform(-1.0, 1.0, shape)
        out[name] = value.astype(_F32)
    return out


def _load_weights(cfg: ReferenceConfig, given: Mapping[str, Any]) -> dict[str, FloatArray]:
    if not isinstance(given, Mapping):
        raise InvalidSettingError(
            f"ReferenceHybrid weights must be a mapping name -> array, got {type(given).__name__}"
        )
    specs = _weight_specs(cfg)
    expected = {name: shape for name, shape, _ in specs}
    missing = [name for name in expected if name not in given]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InvalidSettingError(
            f"ReferenceHybrid weights: missing tensor {missing[0]!r} of shape {expected[missing[0]]}{more}"
        )
    extra = sorted(str(name) for name in given if name not in expected)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise InvalidSettingError(f"ReferenceHybrid weights: unexpected tensor {extra[0]!r}{more} for this config")
    out: dict[str, FloatArray] = {}
    for name, shape, _ in specs:
        raw = np.asarray(given[name])
        if raw.shape != shape:
            raise InvalidSettingError(
                f"ReferenceHybrid weights: tensor {name!r} has shape {raw.shape}, the config needs {shape}"
            )
        if raw.dtype.kind not in "fiu":
            raise InvalidSettingError(f"ReferenceHybrid weights: tensor {name!r} has dtype {raw.dtype}, not a float")
        value = np.array(raw, dtype=_F32, copy=True)
        if not np.isfinite(value).all():
            raise InvalidSettingError(f"ReferenceHybrid weights: tensor {name!r} has non-finite values")
        out[name] = value
    return out


# --------------------------------------------------------------------------- snapshot


def _exactly_equal(a: _Arr, b: _Arr) -> bool:
    """Exact equality under the contract's one comparison policy (``specproof.contract.compare``), same dtype."""
    return bool(a.dtype == b.dtype and arrays_differ(a, b, atol=0.0) is None)


def _shape_repr(a: _Arr) -> str:
    return f"<float32 {a.shape}>"


@attrs.frozen
class ReferenceSnapshot:
    """The recurrent state and ``processed`` of a ``ReferenceHybrid`` (the KV cache is not copied).

    Two snapshots are ``==`` when ``processed`` and both state arrays are exactly equal
    under the contract's comparison policy (whichever target took them). ``target_id`` and
    ``write_clock`` let ``restore`` refuse a snapshot of another target or one whose KV prefix
    was overwritten since.
    The arrays are read-only.
    """

    processed: int
    conv_state: FloatArray = attrs.field(eq=attrs.cmp_using(eq=_exactly_equal), hash=False, repr=_shape_repr)
    rec_state: FloatArray = attrs.field(eq=attrs.cmp_using(eq=_exactly_equal), hash=False, repr=_shape_repr)
    target_id: int = attrs.field(eq=False, repr=False)
    write_clock: int = attrs.field(eq=False, repr=False)
    # a tree node's checkpoint (docs/contract.md, "Trees") also carries its root path's KV rows, written
    # back at slots kv_base .. processed - 1 on restore; None for a plain snapshot
    kv_base: int = attrs.field(default=-1, eq=False, repr=False)
    path_keys_t: FloatArray | None = attrs.field(default=None, eq=False, repr=False)
    path_values: FloatArray | None = attrs.field(default=None, eq=False, repr=False)


# --------------------------------------------------------------------------- the model

_INSTANCE_IDS = itertools.count(1)
# what a ReferenceHybrid never writes after construction, so its deep copies may share it
_SHARED_BY_COPIES: Final = frozenset(
    {"config", "_weights", "_blocks", "_moe", "_embed", "_final_norm", "_head_t", "_cos", "_sin_signed"}
)


def _read_only(arrays: Iterable[FloatArray]) -> None:
    for array in arrays:
        array.flags.writeable = False


# A process builds many models of a few configs (every check and example of a run builds its own target):
# what a model never writes after construction is made once per config and shared, as its deep copies share it.
@functools.lru_cache(maxsize=16)
def _seeded_model(cfg: ReferenceConfig) -> tuple[dict[str, FloatArray], tuple[Block, ...]]:
    """The read-only seeded weights of ``cfg`` and its (stateless) blocks."""
    weights = _init_weights(cfg)
    _read_only(weights.values())
    return weights, _build_blocks(cfg, weights)


def _loaded_model(cfg: ReferenceConfig, given: Mapping[str, Any]) -> tuple[dict[str, FloatArray], tuple[Block, ...]]:
    """Read-only copies of the ``given`` weights, validated against ``cfg``, and their blocks."""
    weights = _load_weights(cfg, given)
    _read_only(weights.values())
    return weights, _build_blocks(cfg, weights)


@functools.lru_cache(maxsize=16)
def _shared_rope_tables(head_dim: int, theta: float, max_context: int) -> tuple[FloatArray, FloatArray]:
    """``rope_tables``, read-only."""
    tables = rope_tables(head_dim, theta, max_context)
    _read_only(tables)
    return tables


def _check_feature_layers(layers: object, n_layers: int, *, who: str) -> tuple[int, ...]:
    """The requested feature layers as a tuple, or ``InvalidSettingError`` naming the bad one."""
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise InvalidSettingError(f"{who}: layers must be a sequence of layer indices, got {type(layers).__name__}")
    out = []
    for i, layer in enumerate(layers):
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= int(layer) < n_layers:
            raise InvalidSettingError(f"{who}: layers[{i}]={layer!r} is not a layer index in [0, {n_layers})")
        out.append(int(layer))
    if not out:
        raise InvalidSettingError(f"{who}: layers is empty; name at least one layer in [0, {n_layers})")
    return tuple(out)


def _checked_tokens(tokens: Sequence[int], v: int, *, processed: int, max_context: int) -> npt.NDArray[np.intp]:
    """Validate ``tokens`` (ids and capacity) without touching any state."""
    toks = _token_array(tokens, v)
    n = toks.shape[0]
    if processed + n > max_context:
        raise CapacityError(
            f"ReferenceHybrid.forward: processed={processed} + len(tokens)={n} exceeds "
            f"max_context={max_context}; nothing was changed"
        )
    return toks


def _token_array(tokens: Sequence[int], v: int) -> npt.NDArray[np.intp]:
    """``tokens`` as an index array, or ``TokenRangeError`` naming the first id that is not in ``[0, v)``."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise TokenRangeError(f"ReferenceHybrid.forward: tokens must be 1-D, got shape {tokens.shape}")
        if tokens.size and tokens.dtype.kind not in "iu":
            raise TokenRangeError(
                f"ReferenceHybrid.forward: tokens[0]={tokens[0]!r} is not an integer token id "
                f"(array dtype {tokens.dtype})"
            )
        bad = np.flatnonzero((tokens < 0) | (tokens >= v)) if tokens.size else np.zeros(0, np.intp)
        if bad.size:
            i = int(bad[0])
            raise TokenRangeError(f"ReferenceHybrid.forward: tokens[{i}]={int(tokens[i])} is outside [0, {v})")
        return tokens.astype(np.intp)
    if isinstance(tokens, str) or not isinstance(tokens, Iterable):
        raise TokenRangeError(
            f"ReferenceHybrid.forward: tokens must be a sequence of ints, got {type(tokens).__name__}"
        )
    seq = tokens if isinstance(tokens, (list, tuple)) else list(tokens)  # bytes give ints
    for i, t in enumerate(seq):
        if type(t) is not int and not isinstance(t, np.integer):  # bool is excluded on purpose
            raise TokenRangeError(
                f"ReferenceHybrid.forward: tokens[{i}]={t!r} ({type(t).__name__}) is not an integer token id"
            )
        if not 0 <= t < v:
            raise TokenRangeError(f"ReferenceHybrid.forward: tokens[{i}]={int(t)} is outside [0, {v})")
    return np.array(seq, dtype=np.intp) if seq else np.zeros(0, np.intp)


def _features(c: ReferenceConfig) -> str:
    """`` features=...``: the real-model features the config turns on (nothing for the defaults)."""
    on = [f"{c.router}-router"] if c.router != "softmax" else []
    on += [name.replace("_", "-") for name in ("shared_expert", "attn_output_gate") if getattr(c, name)]
    return f" features={'+'.join(on)}" if on else ""


def _no_routing(k: int) -> npt.NDArray[np.int64]:
    return np.zeros((0, k), np.int64)


def _build_blocks(cfg: ReferenceConfig, w: Mapping[str, FloatArray]) -> tuple[Block, ...]:
    """The blocks of ``cfg.layers`` in order, each with its slot in the state arrays of its kind."""
    blocks: list[Block] = []
    n_attn = n_conv = n_rec = 0
    eps = float(cfg.norm_eps)
    for i, kind in enumerate(cfg.layers):
        p = f"model.layers.{i}."
        ffn = build_ffn(w, p, n_experts=cfg.n_experts, experts_per_token=cfg.experts_per_token)
        if kind == "conv":
            blocks.append(ConvBlock(w, p, n_conv, ffn))
            n_conv += 1
        elif kind == "attn":
            blocks.append(
                AttnBlock(
                    w,
                    p,
                    n_attn,
                    ffn,
                    n_heads=cfg.n_heads,
                    n_kv_heads=cfg.n_kv_heads,
                    head_dim=cfg.head_dim,
                    eps=eps,
                    output_gate=cfg.attn_output_gate,
                )
            )
            n_attn += 1
        else:
            blocks.append(
                GdnBlock(
                    w,
                    p,
                    n_conv,
                    n_rec,
                    ffn,
                    heads=cfg.gdn_heads,
                    key_dim=cfg.gdn_key_dim,
                    value_dim=cfg.gdn_value_dim,
                    eps=eps,
                )
            )
            n_conv += 1
            n_rec += 1
    return tuple(blocks)


def _checkpoints(
    conv_ck: _Arr, rec_ck: _Arr, count: int, *, base: int, target_id: int, write_clock: int
) -> list[object]:
    """``checkpoints[i]`` == ``snapshot()`` after the first ``i + 1`` of ``count`` tokens fed from ``base``, from
    the per-token states one forward recorded (``write_clock``: the clock after that forward)."""
    return [
        ReferenceSnapshot(
            processed=base + i + 1,
            conv_state=conv_ck[i],
            rec_state=rec_ck[i],
            target_id=target_id,
            write_clock=write_clock,
        )
        for i in range(count)
    ]


_KV_SLOT_AXIS: Final = {"_keys_t": 3, "_value_cache": 2}  # each KV cache's slot (position) axis


def _valid_kv_copy(cache: _Arr, processed: int, *, axis: int) -> _Arr:
    """A copy of a KV cache's first ``processed`` slots, the rest zero: a slot past ``processed`` is only ever
    summed with weight 0 until a forward writes it, so a copy need not pay for the whole ``max_context``."""
    out = np.zeros(cache.shape, cache.dtype)
    valid = (slice(None),) * axis + (slice(0, processed),)
    out[valid] = cache[valid]
    return out


def _copy_sharing_weights(model: ReferenceHybrid, memo: dict[int, Any]) -> ReferenceHybrid:
    """``copy.deepcopy(model)``: a new instance with its own id and copies of the states, sharing with
    ``model`` what it never writes after construction (``_SHARED_BY_COPIES``)."""
    new = type(model).__new__(type(model))
    memo[id(model)] = new
    for name, value in model.__dict__.items():
        if name in _SHARED_BY_COPIES:
            new.__dict__[name] = value
        elif name in ("_routing", "_margins"):  # read-only arrays
            new.__dict__[name] = list(value)
        elif name in _KV_SLOT_AXIS:
            new.__dict__[name] = _valid_kv_copy(value, model._processed, axis=_KV_SLOT_AXIS[name])
        else:
            new.__dict__[name] = copy.deepcopy(value, memo)
    new._id = next(_INSTANCE_IDS)
    return new


def _restorable(
    snapshot: object, target_id: int, stamps: npt.NDArray[np.int64], current: int
) -> tuple[ReferenceSnapshot, int]:
    """``ReferenceHybrid.restore``'s checks: ``snapshot`` is one of target ``target_id``'s, and no KV slot below
    the part it keeps was rewritten since; returns it and that part's length (a tree checkpoint rewrites the rest).
    """
    if not isinstance(snapshot, ReferenceSnapshot):
        raise TargetContractError(
            f"ReferenceHybrid.restore: expected a ReferenceSnapshot taken from this target, "
            f"got {type(snapshot).__name__}"
        )
    if snapshot.target_id != target_id:
        raise TargetContractError(
            f"ReferenceHybrid.restore: the snapshot (processed={snapshot.processed}) was taken from a different "
            f"ReferenceHybrid instance (#{snapshot.target_id}; this is #{target_id})"
        )
    n = snapshot.processed
    stable = n if snapshot.path_keys_t is None else snapshot.kv_base
    newer = stamps[:stable] > snapshot.write_clock
    if newer.any():
        raise StaleSnapshotError(
            f"ReferenceHybrid.restore: the snapshot at processed={n} is stale: KV slot {int(np.argmax(newer))} was "
            f"overwritten after it was taken (current processed={current})"
        )
    return snapshot, stable


class ReferenceHybrid:
    """A seeded hybrid LM in numpy implementing ``Target``, ``CheckpointingTarget`` and ``WhiteBoxTarget``.

    ``ReferenceHybrid(config=None, *, weights=None)``: ``config`` defaults to
    ``default_config()``; ``weights`` (HF LFM2 names, see ``weights``) replaces the
    seeded initialisation and is validated against the config.
    """

    def __init__(self, config: ReferenceConfig | None = None, *, weights: Mapping[str, Any] | None = None) -> None:
        cfg = default_config() if config is None else config
        if not isinstance(cfg, ReferenceConfig):
            raise InvalidSettingError(f"ReferenceHybrid config must be a ReferenceConfig, got {type(cfg).__name__}")
        self.config: ReferenceConfig = cfg
        self.vocab_size: int = int(cfg.vocab_size)
        self.max_context: int = int(cfg.max_context)
        w, blocks = _seeded_model(cfg) if weights is None else _loaded_model(cfg, weights)
        self._weights: dict[str, FloatArray] = w
        self._id = next(_INSTANCE_IDS)
        self._eps = float(cfg.norm_eps)
        self._take_blocks(cfg, w, blocks)
        self._build_tables(cfg)
        self._allocate_states(cfg)

    # ----------------------------------------------------------------- setup

    def _take_blocks(self, cfg: ReferenceConfig, w: Mapping[str, FloatArray], blocks: tuple[Block, ...]) -> None:
        self._blocks: tuple[Block, ...] = blocks
        self._moe: tuple[MoeFfn, ...] = tuple(blk.ffn for blk in self._blocks if isinstance(blk.ffn, MoeFfn))
        self._routing: list[npt.NDArray[np.int64]] = [_no_routing(ffn.k) for ffn in self._moe]
        self._margins: list[FloatArray] = [np.zeros(0, _F32) for _ in self._moe]
        self._embed = w["model.embed_tokens.weight"]
        self._final_norm = w["model.embedding_norm.weight"]
        head = self._embed if cfg.tie_embeddings else w["lm_head.weight"]
        self._head_t = np.ascontiguousarray(head.T)

    def _build_tables(self, cfg: ReferenceConfig) -> None:
        # RoPE tables for every position
        self._cos, self._sin_signed = _shared_rope_tables(cfg.head_dim, cfg.rope_theta, cfg.max_context)

    def _allocate_states(self, cfg: ReferenceConfig) -> None:
        # keys stored transposed ([layers, kv, hd, slots]): attention multiplies by row-major [hd, n] blocks;
        # slots past max_context (up to a whole KEY_BLOCK) are only ever summed with weight 0
        slots = key_width(cfg.max_context)
        self._keys_t = np.zeros((cfg.n_attn_layers, cfg.n_kv_heads, cfg.head_dim, slots), _F32)
        self._value_cache = np.zeros((cfg.n_attn_layers, cfg.n_kv_heads, slots, cfg.head_dim), _F32)
        self._conv_state = np.zeros((cfg.n_conv_layers, cfg.conv_channels, cfg.conv_kernel - 1), _F32)
        self._rec_state = np.zeros((cfg.n_gdn_layers, cfg.gdn_heads, cfg.gdn_key_dim, cfg.gdn_value_dim), _F32)
        # stale-snapshot detection: the id of the forward that last wrote each KV slot
        self._stamps = np.zeros(cfg.max_context, np.int64)
        self._clock = 0
        self._processed = 0

    # ----------------------------------------------------------------- protocol

    @property
    def processed(self) -> int:
        """Tokens fed so far: the valid length of the KV cache."""
        return self._processed

    @property
    def weights(self) -> dict[str, FloatArray]:
        """Every tensor by HF ``Lfm2ForCausalLM`` name (GDN blocks: ``linear_attn.*`` as Qwen3.5); read-only."""
        return dict(self._weights)

    @property
    def last_routing(self) -> tuple[npt.NDArray[np.int64], ...]:
        """Per MoE layer, the expert ids ``[q, experts_per_token]`` each position of the last forward chose."""
        return tuple(self._routing)

    @property
    def last_router_margins(self) -> tuple[FloatArray, ...]:
        """Per MoE layer, ``[q]``: each position's router margin in the last forward (``router_margins``: the
        smallest nonzero gap between a chosen and an unchosen expert's router logit; ``inf`` if none)."""
        return tuple(self._margins)

    @property
    def last_experts_touched(self) -> tuple[frozenset[int], ...]:
        """Per MoE layer, the set of experts the last forward read."""
        return tuple(frozenset(np.unique(chosen).tolist()) for chosen in self._routing)

    def forward(self, tokens: Sequence[int]) -> FloatArray:
        """Feed ``tokens`` after the processed ones; return their logits ``[len(tokens), vocab_size]``.

        Validates everything first: a bad token id raises ``TokenRangeError`` and a
        forward past ``max_context`` raises ``CapacityError``, with nothing changed.
        """
        toks = self._check(tokens)
        logits, _, _ = self._run(toks, record=False)
        return logits

    def forward_without_logits(self, tokens: Sequence[int]) -> None:
        """``forward`` without the logits: the same states, bit for bit, without the work only logits need."""
        if type(self).forward is ReferenceHybrid.forward:  # else a subclass's forward is the one to run
            self._run(self._check(tokens), record=False, head=False)
        else:
            self.forward(tokens)

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[FloatArray, list[object]]:
        """``forward`` plus ``checkpoints[i]`` == ``snapshot()`` after ``tokens[: i + 1]``, in the same pass."""
        toks = self._check(tokens)
        base = self._processed
        logits, conv_ck, rec_ck = self._run(toks, record=True)
        return logits, _checkpoints(conv_ck, rec_ck, len(toks), base=base, target_id=self._id, write_clock=self._clock)

    @property
    def d_model(self) -> int:
        """Width of every feature row (docs/contract.md, "Targets": features)."""
        return int(self.config.d_model)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The layers ``forward_with_features`` can return: ``i`` is the residual stream after block ``i``."""
        return tuple(range(len(self.config.layers)))

    def forward_with_features(
        self, tokens: Sequence[int], layers: Sequence[int], *, checkpoints: bool = False
    ) -> tuple[FloatArray, dict[int, FloatArray], list[object] | None]:
        """``forward`` plus ``features[layer]`` ``[len(tokens), d_model]``: the residual stream after block
        ``layer`` at each fed position (before the final norm), in the same pass; with ``checkpoints=True``
        also ``forward_with_checkpoints``'s list, else ``None``. A bad layer raises ``InvalidSettingError``
        with nothing changed."""
        wanted = _check_feature_layers(layers, len(self.config.layers), who="ReferenceHybrid.forward_with_features")
        toks = self._check(tokens)
        base = self._processed
        features: dict[int, FloatArray] = {layer: np.zeros((0, self.d_model), _F32) for layer in wanted}
        logits, conv_ck, rec_ck = self._run(toks, record=checkpoints, features=features)
        cks: list[object] | None = None
        if checkpoints:
            cks = _checkpoints(conv_ck, rec_ck, len(toks), base=base, target_id=self._id, write_clock=self._clock)
        for value in features.values():
            value.flags.writeable = False
        return logits, features, cks

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> tuple[FloatArray, list[object]]:
        """Verify a token tree (docs/contract.md, "Trees"; ``parents[i]``: node ``i``'s parent, ``-1`` the
        context): ``logits[i]`` and ``checkpoints[i]`` (restorable, KV rows included) of node ``i``'s root path,
        bit-identical to sequential decoding of it; the target's own state is left as it was."""
        return tree_forward(self, _token_array(tokens, self.vocab_size), parents, snapshot=ReferenceSnapshot)

    def _tree_sources(self, parents: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The node whose conv window and whose recurrent state each node continues from: its parent
        (``-1``: the state before the tree). The zoo overrides this to plant per-branch state bugs."""
        return parents, parents

    def snapshot(self) -> ReferenceSnapshot:
        """Copy the conv and recurrent states and ``processed`` (not the append-only KV cache)."""
        conv = self._conv_state.copy()
        rec = self._rec_state.copy()
        conv.flags.writeable = False
        rec.flags.writeable = False
        return ReferenceSnapshot(
            processed=self._processed, conv_state=conv, rec_state=rec, target_id=self._id, write_clock=self._clock
        )

    def restore(self, snapshot: object) -> None:
        """Put back a snapshot or checkpoint of this target.

        Raises ``TargetContractError`` for anything else and ``StaleSnapshotError``
        when a KV slot below the snapshot's ``processed`` was rewritten after it was taken.
        """
        snapshot, stable = _restorable(snapshot, self._id, self._stamps, self._processed)
        n = snapshot.processed
        if snapshot.path_keys_t is not None and snapshot.path_values is not None:
            self._keys_t[..., stable:n] = snapshot.path_keys_t
            self._value_cache[:, :, stable:n] = snapshot.path_values
            self._clock += 1
            self._stamps[stable:n] = self._clock
        np.copyto(self._conv_state, snapshot.conv_state)
        np.copyto(self._rec_state, snapshot.rec_state)
        self._processed = n

    def reset(self) -> None:
        """Back to the empty context: ``processed = 0``, zero states; every earlier snapshot becomes stale."""
        self._conv_state.fill(0.0)
        self._rec_state.fill(0.0)
        self._clock += 1
        self._stamps.fill(self._clock)
        self._processed = 0
        self._routing = [_no_routing(ffn.k) for ffn in self._moe]
        self._margins = [np.zeros(0, _F32) for _ in self._moe]

    def state_arrays(self) -> dict[str, FloatArray]:
        """Copies of the four device states, KV caches cut to the valid prefix."""
        n = self._processed
        return {
            "key_cache": self._keys_t[..., :n].transpose(0, 1, 3, 2).copy(),
            "value_cache": self._value_cache[:, :, :n].copy(),
            "conv_state": self._conv_state.copy(),
            "rec_state": self._rec_state.copy(),
        }

    def __deepcopy__(self, memo: dict[int, Any]) -> ReferenceHybrid:
        """A new instance (its own id, so neither takes the other's snapshots) with copies of the states.

        The weights, blocks and tables are read-only and shared: a copy costs the states, not the model.
        """
        return _copy_sharing_weights(self, memo)

    # ----------------------------------------------------------------- info

    def parameter_bytes(self) -> dict[str, int]:
        """Weight bytes a forward reads, for bandwidth counts.

        ``dense``: every non-expert tensor (embeddings, norms, mixers, routers, head);
        ``per_expert``: one expert of one MoE layer (w1, w2, w3), 0 for a dense model.
        A forward reads ``dense + per_expert * sum(len(s) for s in last_experts_touched)``.
        """
        dense = sum(v.nbytes for k, v in self._weights.items() if ".experts." not in k)
        one = "model.layers.0.feed_forward.experts.0."
        per_expert = sum(v.nbytes for k, v in self._weights.items() if k.startswith(one))
        return {"dense": int(dense), "per_expert": int(per_expert)}

    def describe(self) -> str:
        """One line: layer pattern, sizes, parameter count, context and feed-forward kind."""
        c = self.config
        params = sum(v.size for v in self._weights.values())
        ffn = (
            f"moe({c.n_experts} experts, top-{c.experts_per_token}, {c.expert_ffn_dim} wide)"
            if c.is_moe
            else f"dense({c.ffn_dim})"
        )
        return (
            f"ReferenceHybrid layers={'+'.join(c.layers)} d_model={c.d_model} vocab={c.vocab_size} "
            f"attn={c.n_heads}q/{c.n_kv_heads}kv x{c.head_dim} gdn={c.gdn_heads}x{c.gdn_key_dim}x{c.gdn_value_dim} "
            f"conv_kernel={c.conv_kernel} ffn={ffn}{_features(c)} params={params:,} max_context={c.max_context} "
            f"seed={c.seed}"
        )

    def __repr__(self) -> str:
        return f"<{self.describe()} processed={self._processed}>"

    # ----------------------------------------------------------------- forward internals

    def _check(self, tokens: Sequence[int]) -> npt.NDArray[np.intp]:
        return _checked_tokens(tokens, self.vocab_size, processed=self._processed, max_context=self.max_context)

    def _run(
        self, toks: _Arr, *, record: bool, features: dict[int, FloatArray] | None = None, head: bool = True
    ) -> tuple[FloatArray, _Arr, _Arr]:
        """The forward pass over validated tokens; updates every state; optionally records checkpoints
        and (``features``: the layers wanted, filled in) the residual stream after those blocks; without the
        ``head`` (``forward_without_logits``, a dense model) it stops at the last block's state: no logits."""
        q = toks.shape[0]
        base = self._processed
        conv_ck = rec_ck = np.zeros((0,), _F32)
        if record:
            conv_ck = np.zeros((q, *self._conv_state.shape), _F32)
            rec_ck = np.zeros((q, *self._rec_state.shape), _F32)
        if q == 0:
            self._routing = [_no_routing(ffn.k) for ffn in self._moe]
            self._margins = [np.zeros(0, _F32) for _ in self._moe]
            conv_ck.flags.writeable = False
            rec_ck.flags.writeable = False
            return np.zeros((0, self.vocab_size), _F32), conv_ck, rec_ck
        total = base + q
        cos = self._cos[base:total, None, :]
        sin = self._sin_signed[base:total, None, :]
        eps = self._eps
        conv_rec = conv_ck if record else None
        rec_rec = rec_ck if record else None
        routing: list[npt.NDArray[np.int64]] = []
        margins: list[FloatArray] = []
        last = len(self._blocks) - 1 if not head and not self._moe and features is None else -1  # routing is a result
        with np.errstate(over="ignore"):  # silu/sigmoid of large negatives overflow exp harmlessly
            h = self._embed[toks]
            for index, blk in enumerate(self._blocks):
                x = _rms_norm(h, blk.op_norm, eps)
                if index == last and isinstance(blk, AttnBlock):
                    blk.append_kv(x, base, cos, sin, self._keys_t, self._value_cache)  # its attention feeds logits only
                    break
                if isinstance(blk, ConvBlock):
                    h += blk.mix(x, self._conv_state, conv_rec)
                elif isinstance(blk, AttnBlock):
                    h += blk.mix(x, base, cos, sin, self._keys_t, self._value_cache)
                else:
                    h += blk.mix(x, self._conv_state, self._rec_state, conv_rec, rec_rec)
                if index == last:
                    break
                if isinstance(blk.ffn, MoeFfn):
                    y, chosen, margin = blk.ffn.route(_rms_norm(h, blk.ffn_norm, eps))
                    routing.append(chosen)
                    margins.append(margin)
                    h += y
                else:
                    h += blk.ffn(_rms_norm(h, blk.ffn_norm, eps))
                if features is not None and index in features:
                    features[index] = h.copy()
            out = _linear(_rms_norm(h, self._final_norm, eps), self._head_t) if last < 0 else h[:0, :0]
        self._routing = routing
        self._margins = margins
        self._clock += 1
        self._stamps[base:total] = self._clock
        self._processed = total
        conv_ck.flags.writeable = False
        rec_ck.flags.writeable = False
        return np.ascontiguousarray(out), conv_ck, rec_ck
