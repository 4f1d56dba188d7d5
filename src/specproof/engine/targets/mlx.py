"""``MLXTarget``: a ``Target`` over an mlx-lm model and its prompt cache (LFM2, Qwen3.5, any mlx-lm model
whose cache is made of ``KVCache`` and ``ArraysCache`` layers).

mlx-lm itself refuses speculative decoding on these hybrid models ("requires a trimmable prompt
cache": an ``ArraysCache`` holding a conv or delta-rule state cannot be trimmed). Here:

- attention layers' ``KVCache`` is rolled back by setting ``offset`` to ``processed`` (the buffer is
  append-only; stale slots are overwritten by the next forward, exactly as ``KVCache.trim`` does);
- every ``ArraysCache`` (LFM2's conv state; Qwen3.5's conv state and delta-rule state) is
  snapshotted by keeping references to its arrays. That is enough: MLX arrays are values, and
  mlx-lm's layers *rebind* ``cache[i] = new_state`` instead of writing into the old array, so a
  kept reference never changes (``tests/frameworks/test_mlx_target.py`` checks this).

**No ``forward_with_checkpoints``.** mlx-lm's ``ShortConv`` and ``GatedDeltaNet`` keep only the
state after the last position of a forward; the per-position states exist only inside the layer
call (the delta-rule kernel never materialises them). Exposing them would mean re-implementing or
patching mlx-lm's layers, which would stop mlx-lm being an independent oracle, or an extra forward
per position. So ``SpecDecoder`` runs this target with ``rollback="replay"``.

Target specs (``load_spec``): ``mlx:lfm2-tiny`` (the seeded tiny reference LFM2 model converted
with ``reference_to_mlx_lfm2``), ``mlx:qwen3_5-tiny`` (a seeded tiny Qwen3.5: three Gated DeltaNet
layers and one attention layer), both with a byte tokenizer and optional ``,seed=N,max_context=N``;
``mlx:/local/path`` (an mlx-lm model directory, loaded offline).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from specproof.contract.errors import InvalidSettingError, StaleSnapshotError, TargetContractError
from specproof.contract.validation import int_at_least
from specproof.engine.targets._framework import (
    ByteTokenizer,
    FrameworkSnapshot,
    KVClock,
    check_forward_tokens,
    check_snapshot,
    default_tie_tolerance,
    next_target_id,
    parse_spec,
)
from specproof.engine.targets._requires import require_mlx

__all__ = ["TINY_MODELS", "MLXTarget", "load_spec", "require_mlx", "tiny_model"]

TINY_MODELS: Final[tuple[str, ...]] = ("lfm2-tiny", "qwen3_5-tiny", "lfm2-trained")
_DEFAULT_MAX_CONTEXT: Final = 512


def _text_args(model: Any) -> Any:
    args = getattr(model, "args", None)
    text = getattr(args, "text_config", None)
    return text if isinstance(text, dict) else args


def _arg(args: Any, key: str, default: Any = None) -> Any:
    if isinstance(args, dict):
        return args.get(key, default)
    return getattr(args, key, default)


class MLXTarget:
    """A ``Target`` (and ``WhiteBoxTarget``) over an mlx-lm model.

    ``MLXTarget(model, *, tokenizer=None, max_context=None, vocab_size=None, name=None)``:
    ``max_context`` defaults to the model's ``max_position_embeddings``, ``vocab_size`` to the
    embedding rows. Logits come back as float32 numpy ``[q, vocab_size]``.
    """

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: Any = None,
        max_context: int | None = None,
        vocab_size: int | None = None,
        name: str | None = None,
        tie_tolerance: float | None = None,
    ) -> None:
        mx, _nn, lm = require_mlx()
        self._mx = mx
        self._make_cache = lm.models.cache.make_prompt_cache
        self._kv_type = lm.models.cache.KVCache
        self._arrays_type = lm.models.cache.ArraysCache
        self.model = model
        args = _text_args(model)
        if vocab_size is None:
            try:
                vocab_size = int(model.model.embed_tokens.weight.shape[0])
            except AttributeError:
                vocab_size = _arg(args, "vocab_size")
        if max_context is None:
            max_context = _arg(args, "max_position_embeddings")
        for field, value in (("vocab_size", vocab_size), ("max_context", max_context)):
            int_at_least(value, name=f"MLXTarget {field}", minimum=1, hint=f" (pass {field}=...)")
        self.vocab_size: int = int(vocab_size)  # type: ignore[arg-type]
        self.max_context: int = int(max_context)  # type: ignore[arg-type]
        self.model_type: str = str(_arg(getattr(model, "args", None), "model_type", type(model).__module__))
        self.name: str = name or f"MLXTarget({self.model_type})"
        self.tokenizer = tokenizer
        if tokenizer is not None:
            self.encode = tokenizer.encode
            self.decode = tokenizer.decode
        self.tie_tolerance: float = (
            default_tie_tolerance(self._dtype_name()) if tie_tolerance is None else float(tie_tolerance)
        )
        self._id = next_target_id()
        self._clock = KVClock(self.max_context)
        self._cache: list[Any] = self._new_cache()
        self._processed = 0

    def _new_cache(self) -> list[Any]:
        cache = list(self._make_cache(self.model))
        for i, layer in enumerate(cache):
            if type(layer) not in (self._kv_type, self._arrays_type):
                raise InvalidSettingError(
                    f"{self.name}: layer {i} uses a {type(layer).__name__}; MLXTarget supports KVCache and "
                    "ArraysCache layers only (no rotating or quantized KV caches)"
                )
        return cache

    # ----------------------------------------------------------------- protocol

    @property
    def processed(self) -> int:
        """Tokens fed so far: the attention layers' KV offset."""
        return self._processed

    def forward(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Feed ``tokens`` after the processed ones; return float32 logits ``[len(tokens), vocab_size]``.

        Token ids and capacity are checked before anything changes (``TokenRangeError``, ``CapacityError``).
        """
        mx = self._mx
        toks = check_forward_tokens(
            tokens, name=self.name, vocab_size=self.vocab_size, processed=self._processed, max_context=self.max_context
        )
        if not toks:
            return np.zeros((0, self.vocab_size), np.float32)
        base = self._processed
        logits = self.model(mx.array([toks], dtype=mx.int32), cache=self._cache)[0].astype(mx.float32)
        mx.eval(logits, [c.state for c in self._cache])
        out = np.array(logits, dtype=np.float32, copy=True)
        total = base + len(toks)
        self._clock.write(base, total)
        self._processed = total
        if out.shape != (len(toks), self.vocab_size):
            raise TargetContractError(
                f"{self.name}: the model returned logits of shape {out.shape}, "
                f"expected ({len(toks)}, {self.vocab_size})"
            )
        for i, layer in enumerate(self._cache):
            if isinstance(layer, self._kv_type) and layer.offset != total:
                raise TargetContractError(f"{self.name}: layer {i} KV offset {layer.offset} != processed {total}")
        return out

    def snapshot(self) -> FrameworkSnapshot:
        """``processed`` and references to every ``ArraysCache`` array (MLX arrays are never written in place)."""
        states = tuple(
            (tuple(layer.cache), layer.left_padding, layer.lengths) if isinstance(layer, self._arrays_type) else None
            for layer in self._cache
        )
        return FrameworkSnapshot(
            processed=self._processed, states=states, target_id=self._id, write_clock=self._clock.clock
        )

    def restore(self, snapshot: object) -> None:
        """Put back a snapshot of this target: KV offsets to its ``processed``, conv/recurrent arrays as they were.

        ``TargetContractError`` for a foreign object or another target's snapshot;
        ``StaleSnapshotError`` when a KV slot below its ``processed`` was rewritten since.
        """
        snapshot = check_snapshot(
            snapshot, name=self.name, target_id=self._id, clock=self._clock, processed=self._processed
        )
        n = snapshot.processed
        for i, layer in enumerate(self._cache):
            if isinstance(layer, self._kv_type) and n > 0 and (layer.keys is None or layer.keys.shape[2] < n):
                raise StaleSnapshotError(f"{self.name}.restore: layer {i} KV buffer no longer holds {n} tokens")
        for layer, state in zip(self._cache, snapshot.states):
            if isinstance(layer, self._kv_type):
                layer.offset = n
            else:
                arrays, left_padding, lengths = state
                layer.cache = list(arrays)
                layer.left_padding = left_padding
                layer.lengths = lengths
        self._processed = n

    def reset(self) -> None:
        """A fresh prompt cache (``processed = 0``); every earlier snapshot becomes stale."""
        self._cache = self._new_cache()
        self._clock.reset()
        self._processed = 0

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        """Copies of the valid states: ``key_cache.L``/``value_cache.L`` (cut to ``processed``) per attention
        layer, ``conv_state.L`` (and ``rec_state.L`` for a delta-rule layer) per ``ArraysCache`` layer."""
        mx = self._mx
        out: dict[str, npt.NDArray[np.float32]] = {}
        for i, layer in enumerate(self._cache):
            if isinstance(layer, self._kv_type):
                if layer.keys is not None and self._processed:
                    k, v = layer.keys[..., : self._processed, :], layer.values[..., : self._processed, :]
                    out[f"key_cache.{i}"] = np.array(k.astype(mx.float32))
                    out[f"value_cache.{i}"] = np.array(v.astype(mx.float32))
            else:
                for j, arr in enumerate(layer.cache):
                    if arr is not None:
                        out[f"{('conv_state', 'rec_state')[j] if j < 2 else f'state{j}'}.{i}"] = np.array(
                            arr.astype(mx.float32)
                        )
        return out

    # ----------------------------------------------------------------- features (docs/contract.md, "Targets")

    def _decoder_layers(self) -> list[Any]:
        """The model's list of decoder layers (``model.model.layers``, or under ``language_model`` for
        Qwen3.5-style wrappers): the list the model iterates in ``__call__``, mutated in place by
        ``forward_with_features``."""
        for owner in (self.model, getattr(self.model, "language_model", None)):
            layers = getattr(getattr(owner, "model", None), "layers", None)
            if isinstance(layers, list) and layers:
                return layers
        raise InvalidSettingError(
            f"{self.name}: the model exposes no decoder layers (model.model.layers or "
            "model.language_model.model.layers), so it cannot return features"
        )

    @property
    def d_model(self) -> int:
        return int(_arg(_text_args(self.model), "hidden_size"))

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Layer ``i``: the residual stream after decoder layer ``i``."""
        return tuple(range(len(self._decoder_layers())))

    def forward_with_features(
        self, tokens: Sequence[int], layers: Sequence[int], *, checkpoints: bool = False
    ) -> tuple[npt.NDArray[np.float32], dict[int, npt.NDArray[np.float32]], list[object] | None]:
        """``forward`` plus each requested decoder layer's output ``[len(tokens), d_model]`` (float32), read in
        the same pass.

        MLX has no forward hooks, so each requested layer is swapped, for this call only, for a wrapper that
        calls it and keeps its output (attribute reads such as ``is_attention_layer`` go through to the
        layer). ``checkpoints=True`` is refused: this target has no ``forward_with_checkpoints`` (module
        docstring), so feature drafters run on it with ``rollback="replay"``.
        """
        from specproof.engine.targets.reference import _check_feature_layers

        blocks = self._decoder_layers()
        wanted = _check_feature_layers(layers, len(blocks), who=f"{self.name}.forward_with_features")
        if checkpoints:
            raise InvalidSettingError(
                f"{self.name}: checkpoints=True, but an MLX target has no forward_with_checkpoints "
                "(use rollback='replay')"
            )
        captured: dict[int, Any] = {}
        originals = {layer: blocks[layer] for layer in dict.fromkeys(wanted)}
        for layer, block in originals.items():
            blocks[layer] = _CapturingLayer(block, layer, captured)
        try:
            logits = self.forward(tokens)
        finally:
            for layer, block in originals.items():
                blocks[layer] = block
        n = len(logits)
        mx = self._mx
        feats: dict[int, npt.NDArray[np.float32]] = {}
        for layer in wanted:
            hidden = captured.get(layer)
            arr = (
                np.zeros((0, self.d_model), np.float32)
                if hidden is None
                else np.array(hidden[0].astype(mx.float32), dtype=np.float32, copy=True)
            )
            if arr.shape != (n, self.d_model):
                raise TargetContractError(
                    f"{self.name}: decoder layer {layer} produced features of shape {arr.shape}, expected "
                    f"({n}, {self.d_model})"
                )
            feats[layer] = arr
        return logits, feats, None

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """An independent target in the same state over the *same* model object (its weights are never written;
        all per-sequence state lives in the cache), with its own snapshot identity."""
        clone = copy.copy(self)
        clone._cache = copy.deepcopy(self._cache, memo)
        clone._clock = copy.deepcopy(self._clock, memo)
        clone._id = next_target_id()
        return clone

    # ----------------------------------------------------------------- info

    def describe(self) -> str:
        """One line: model type, layer kinds, vocabulary, context, parameter count."""
        from mlx.utils import tree_flatten

        kinds = "+".join("attn" if isinstance(c, self._kv_type) else "state" for c in self._cache)

        flat: list[tuple[str, Any]] = tree_flatten(self.model.parameters())  # type: ignore[assignment]
        params = sum(int(v.size) for _, v in flat)
        return (
            f"{self.name}: mlx-lm {self.model_type} layers={kinds} vocab={self.vocab_size} "
            f"max_context={self.max_context} params={params:,} dtype={self._dtype_name()} rollback=replay"
        )

    def __repr__(self) -> str:
        return f"<{self.describe()} processed={self._processed}>"

    def _dtype_name(self) -> str:
        return str(self.model.model.embed_tokens.weight.dtype).replace("mlx.core.", "")


# --------------------------------------------------------------------------- tiny models


def tiny_model(
    name: str, *, seed: int = 0, max_context: int = _DEFAULT_MAX_CONTEXT, trained: Callable[[int], Any] | None = None
) -> Any:
    """The mlx-lm model of a built-in tiny config (seeded, float32)."""
    require_mlx()
    if name == "lfm2-tiny":
        from specproof.engine.targets.convert import reference_to_mlx_lfm2, tiny_lfm2_reference

        return reference_to_mlx_lfm2(tiny_lfm2_reference(seed=seed, max_context=max_context))
    if name == "lfm2-trained":  # the committed trained fixture (issue 7), converted
        from specproof.engine.targets.convert import reference_to_mlx_lfm2

        if trained is None:
            raise InvalidSettingError(
                "mlx:lfm2-trained converts the trained fixture: load it through specproof.plugins.load_target"
            )
        return reference_to_mlx_lfm2(trained(max_context))
    if name == "qwen3_5-tiny":
        import importlib

        from specproof.engine.targets.convert import qwen3_5_weights_to_mlx, tiny_qwen3_5_config, tiny_qwen3_5_weights

        arch = importlib.import_module("mlx_lm.models.qwen3_5")
        config = {"model_type": "qwen3_5", "text_config": tiny_qwen3_5_config(max_context=max_context)}
        model = arch.Model(arch.ModelArgs.from_dict(config))
        qwen3_5_weights_to_mlx(model, tiny_qwen3_5_weights(seed=seed))
        model.eval()
        return model
    raise InvalidSettingError(f"unknown tiny MLX model {name!r}; known: {', '.join(TINY_MODELS)}")


def load_spec(args: str, *, trained: Callable[[int], Any] | None = None) -> MLXTarget:
    """The ``mlx:`` target family: ``mlx:lfm2-tiny``, ``mlx:qwen3_5-tiny`` (``,seed=N,max_context=N``),
    or ``mlx:/local/path`` (offline)."""
    name, extra = parse_spec(args, family="mlx", tiny=TINY_MODELS)
    if name is not None:
        assert isinstance(extra, dict)
        max_context = extra.get("max_context", _DEFAULT_MAX_CONTEXT)
        model = tiny_model(name, seed=extra.get("seed", 0), max_context=max_context, trained=trained)
        spec = f"mlx:{name}" + "".join(f",{k}={v}" for k, v in sorted(extra.items()))
        return MLXTarget(model, tokenizer=ByteTokenizer(256), max_context=max_context, name=spec)
    assert isinstance(extra, Path)
    _mx, _nn, lm = require_mlx()
    try:
        model, config = lm.utils.load_model(extra)
    except (FileNotFoundError, ValueError) as exc:
        raise InvalidSettingError(f"mlx:{extra}: mlx-lm could not load the model: {exc}") from exc
    try:
        tokenizer = lm.utils.load_tokenizer(extra, eos_token_ids=config.get("eos_token_id"))
    except Exception:  # a model directory without tokenizer files: ids only, no encode/decode
        tokenizer = None
    return MLXTarget(model, tokenizer=tokenizer, name=f"mlx:{extra}")


class _CapturingLayer:
    """A stand-in for one decoder layer during ``MLXTarget.forward_with_features``: calls the layer and keeps
    its output; every other attribute is the layer's."""

    def __init__(self, layer: Any, index: int, captured: dict[int, Any]) -> None:
        self._layer = layer
        self._index = index
        self._captured = captured

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._layer(*args, **kwargs)
        self._captured[self._index] = out[0] if isinstance(out, tuple) else out
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)
