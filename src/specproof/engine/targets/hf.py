"""``HFTarget``: a ``Target`` over a Hugging Face transformers causal LM and its ``DynamicCache``.

Works with the transformers 5 cache API, where ``DynamicCache(config=model.config)`` holds one
layer object per decoder layer: a ``DynamicLayer`` (keys/values, grown by concatenation) for an
attention layer, a ``LinearAttentionLayer`` (``conv_states`` / ``recurrent_states``) for an LFM2
short-conv or a Qwen3.5 / Qwen3-Next Gated DeltaNet layer. Rollback uses only the public API:

- attention layers are cropped with ``DynamicLayer.crop(-n)`` down to ``processed``;
- conv and recurrent states are *copied* by ``snapshot`` (transformers updates them in place
  with ``copy_``, so a reference would change under us) and copied back by ``restore``.

``Cache.crop`` itself is not enough for these models: on a linear-attention layer it only works
with "past recording" on, and never for a recurrent state (``is_croppable`` is False).

**``forward_with_checkpoints`` for LFM2 only.** The models return only the state after the last
position of a forward. For LFM2 that state is the short conv's window of its input, and the
forward builds that input for every position (the previous window followed by this forward's
columns), so the window after each position is a slice of it: ``HFTarget`` captures it from the
cache's ``update_conv_state`` and returns a checkpoint per position. A Gated-DeltaNet state
(Qwen3.5) cannot be had per position that way, so those models run with ``rollback="replay"``.

Target specs (``load_spec``): ``hf:lfm2-tiny`` (the seeded tiny reference LFM2 converted with
``reference_to_hf_lfm2``), ``hf:qwen3_5-tiny`` (a seeded tiny Qwen3.5, the same weights as
``mlx:qwen3_5-tiny``), ``hf:llama-tiny`` (a dense Llama, plain KV cache), each with a byte
tokenizer and optional ``,seed=N,max_context=N``; ``hf:/local/path`` (``local_files_only``).
"""

from __future__ import annotations

import copy
import inspect
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
    seeded_normal_init,
)
from specproof.engine.targets._requires import require_hf

__all__ = ["TINY_MODELS", "HFTarget", "load_spec", "require_hf", "tiny_model"]

TINY_MODELS: Final[tuple[str, ...]] = ("lfm2-tiny", "qwen3_5-tiny", "llama-tiny", "lfm2-trained")
_DEFAULT_MAX_CONTEXT: Final = 512


class HFTarget:
    """A ``Target`` (and ``WhiteBoxTarget``) over a transformers causal LM (batch 1, no attention mask).

    ``HFTarget(model, *, tokenizer=None, max_context=None, vocab_size=None, name=None)``:
    ``max_context`` defaults to the config's ``max_position_embeddings``, ``vocab_size`` to the
    config's. Logits come back as float32 numpy ``[q, vocab_size]``.
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
        torch, transformers = require_hf()
        from transformers import cache_utils

        self._torch = torch
        self._dynamic_cache = transformers.DynamicCache
        self._kv_layer = cache_utils.DynamicLayer
        self._linear_layer = cache_utils.LinearAttentionLayer
        self.model = model.eval()
        config = model.config.get_text_config(decoder=True)
        self.config = config
        if vocab_size is None:
            vocab_size = getattr(config, "vocab_size", None)
        if max_context is None:
            max_context = getattr(config, "max_position_embeddings", None)
        for field, value in (("vocab_size", vocab_size), ("max_context", max_context)):
            int_at_least(value, name=f"HFTarget {field}", minimum=1, hint=f" (pass {field}=...)")
        self.vocab_size: int = int(vocab_size)  # type: ignore[arg-type]
        self.max_context: int = int(max_context)  # type: ignore[arg-type]
        self.model_type: str = str(getattr(config, "model_type", type(model).__name__))
        self.name: str = name or f"HFTarget({type(model).__name__})"
        self.tokenizer = tokenizer
        if tokenizer is not None:
            self.encode = tokenizer.encode
            self.decode = tokenizer.decode
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._device = next(model.parameters()).device
        self.tie_tolerance: float = (
            default_tie_tolerance(self._dtype_name()) if tie_tolerance is None else float(tie_tolerance)
        )
        self._id = next_target_id()
        self._clock = KVClock(self.max_context)
        self._cache = self._new_cache()
        self._processed = 0
        if self.model_type == "lfm2":
            # LFM2's only recurrent state is the short conv's window of its input, and the verify
            # forward computes that input for every position: the state after each position is a
            # slice of it, so checkpoint rollback costs no extra forward. (Gated DeltaNet states
            # are not recoverable per position: those models stay replay-only.)
            self.forward_with_checkpoints = self._forward_with_checkpoints

    def _new_cache(self) -> Any:
        cache = self._dynamic_cache(config=self.model.config)
        for i, layer in enumerate(cache.layers):
            if type(layer) not in (self._kv_layer, self._linear_layer):
                raise InvalidSettingError(
                    f"{self.name}: cache layer {i} is a {type(layer).__name__}; HFTarget supports DynamicLayer "
                    "(attention) and LinearAttentionLayer (conv / recurrent) layers only"
                )
        if not any(type(layer) is self._kv_layer for layer in cache.layers):
            raise InvalidSettingError(
                f"{self.name}: the model has no attention layer (positions come from the KV cache)"
            )
        return cache

    # ----------------------------------------------------------------- protocol

    @property
    def processed(self) -> int:
        """Tokens fed so far: the attention layers' KV length."""
        return self._processed

    def forward(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Feed ``tokens`` after the processed ones; return float32 logits ``[len(tokens), vocab_size]``.

        Token ids and capacity are checked before anything changes (``TokenRangeError``, ``CapacityError``).
        """
        torch = self._torch
        toks = check_forward_tokens(
            tokens, name=self.name, vocab_size=self.vocab_size, processed=self._processed, max_context=self.max_context
        )
        if not toks:
            return np.zeros((0, self.vocab_size), np.float32)
        base = self._processed
        ids = torch.tensor([toks], dtype=torch.long, device=self._device)
        with torch.inference_mode():
            out = self.model(input_ids=ids, use_cache=True, **{self._cache_kw: self._cache})
            logits = out.logits[0, :, : self.vocab_size].to(torch.float32).cpu().numpy().copy()
        total = base + len(toks)
        self._clock.write(base, total)
        self._processed = total
        if logits.shape != (len(toks), self.vocab_size):
            raise TargetContractError(
                f"{self.name}: the model returned logits of shape {logits.shape}, expected ({len(toks)}, "
                f"{self.vocab_size})"
            )
        seen = self._cache.get_seq_length()
        if seen != total:
            raise TargetContractError(
                f"{self.name}: the KV cache holds {seen} tokens after a forward, expected {total}"
            )
        return logits

    def _forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[npt.NDArray[np.float32], list[object]]:
        """``forward`` plus the snapshot after each position (``checkpoints[i]`` == snapshot after ``tokens[:i+1]``).

        The conv windows are sliced from the full conv input transformers builds for the causal
        conv (previous window ++ this forward's inputs), captured from the cache's
        ``update_conv_state``; the KV needs nothing (a checkpoint's ``processed`` crops it).
        """
        toks = list(tokens)
        if len(toks) <= 1:  # a one-token forward takes transformers' fused path: the state after it is current
            logits = self.forward(toks)
            return logits, [self.snapshot()] if toks else []
        captured: dict[int, Any] = {}
        originals = _capture_conv_inputs(self._cache.layers, self._linear_layer, captured)
        try:
            logits = self.forward(toks)
        finally:
            for i in originals:
                del self._cache.layers[i].update_conv_state  # back to the class's method
        after = self.snapshot()
        q, base = len(toks), self._processed - len(toks)
        checkpoints: list[object] = []
        for pos in range(q):
            states = _states_at(self._torch, after.states, captured, back=q - 1 - pos)
            checkpoints.append(
                FrameworkSnapshot(
                    processed=base + pos + 1, states=states, target_id=self._id, write_clock=after.write_clock
                )
            )
        return logits, checkpoints

    def snapshot(self) -> FrameworkSnapshot:
        """``processed`` and clones of every conv / recurrent state tensor (transformers writes them in place)."""
        states: list[Any] = []
        with self._torch.inference_mode():
            for layer in self._cache.layers:
                states.append(_linear_state(layer) if type(layer) is self._linear_layer else None)
        return FrameworkSnapshot(
            processed=self._processed, states=tuple(states), target_id=self._id, write_clock=self._clock.clock
        )

    def restore(self, snapshot: object) -> None:
        """Put back a snapshot of this target: KV cropped to its ``processed``, conv/recurrent states copied back.

        ``TargetContractError`` for a foreign object or another target's snapshot;
        ``StaleSnapshotError`` when a KV slot below its ``processed`` was rewritten or cropped since.
        """
        snapshot = check_snapshot(
            snapshot, name=self.name, target_id=self._id, clock=self._clock, processed=self._processed
        )
        n = snapshot.processed
        layers = self._cache.layers
        for i, layer in enumerate(layers):
            if type(layer) is self._kv_layer and layer.get_seq_length() < n:
                raise StaleSnapshotError(
                    f"{self.name}.restore: the snapshot at processed={n} is stale: layer {i} KV was cropped to "
                    f"{layer.get_seq_length()} tokens since"
                )
        with self._torch.inference_mode():
            for layer, state in zip(layers, snapshot.states):
                if type(layer) is self._kv_layer:
                    excess = layer.get_seq_length() - n
                    if excess > 0:
                        layer.crop(-excess)
                    continue
                _put_back_linear_state(layer, state)
        self._processed = n

    def reset(self) -> None:
        """A fresh ``DynamicCache`` (``processed = 0``); every earlier snapshot becomes stale."""
        self._cache = self._new_cache()
        self._clock.reset()
        self._processed = 0

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        """Copies of the valid states: ``key_cache.L``/``value_cache.L`` per attention layer (``processed``
        long), ``conv_state.L`` and ``rec_state.L`` per conv / recurrent layer (where initialised)."""
        torch = self._torch
        out: dict[str, npt.NDArray[np.float32]] = {}

        def arr(t: Any) -> npt.NDArray[np.float32]:
            return t.detach().to(torch.float32).cpu().numpy().copy()  # type: ignore[no-any-return]

        for i, layer in enumerate(self._cache.layers):
            if type(layer) is self._kv_layer:
                if layer.get_seq_length():
                    out[f"key_cache.{i}"] = arr(layer.keys)
                    out[f"value_cache.{i}"] = arr(layer.values)
            else:
                for idx, t in layer.conv_states.items():
                    if t is not None and layer.has_previous_state[idx]:
                        out[f"conv_state.{i}" + (f".{idx}" if idx else "")] = arr(t)
                for idx, t in layer.recurrent_states.items():
                    if t is not None and layer.has_previous_state[idx]:
                        out[f"rec_state.{i}" + (f".{idx}" if idx else "")] = arr(t)
        return out

    # ----------------------------------------------------------------- features (docs/contract.md, "Targets")

    def _blocks(self) -> Any:
        inner = getattr(self.model, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None:
            raise InvalidSettingError(f"{self.name}: the model exposes no decoder layers (model.model.layers)")
        return layers

    @property
    def d_model(self) -> int:
        return int(self.config.hidden_size)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Layer ``i``: the residual stream after decoder layer ``i`` (captured by a forward hook on it)."""
        return tuple(range(int(self.config.num_hidden_layers)))

    def forward_with_features(
        self, tokens: Sequence[int], layers: Sequence[int], *, checkpoints: bool = False
    ) -> tuple[npt.NDArray[np.float32], dict[int, npt.NDArray[np.float32]], list[object] | None]:
        """``forward`` plus each requested decoder layer's output ``[len(tokens), d_model]`` (float32), read by
        forward hooks on the layers in the same pass; ``checkpoints=True`` needs ``forward_with_checkpoints``."""
        from specproof.engine.targets.reference import _check_feature_layers

        wanted = _check_feature_layers(layers, len(self.feature_layers), who=f"{self.name}.forward_with_features")
        if checkpoints and not callable(getattr(self, "forward_with_checkpoints", None)):
            raise InvalidSettingError(f"{self.name}: checkpoints=True, but this model has no forward_with_checkpoints")
        blocks = self._blocks()
        captured: dict[int, npt.NDArray[np.float32]] = {}

        handles = [
            blocks[layer].register_forward_hook(_feature_hook(self._torch, layer, captured))
            for layer in dict.fromkeys(wanted)
        ]
        try:
            cks: list[object] | None = None
            if checkpoints:
                logits, cks = self.forward_with_checkpoints(tokens)  # type: ignore[attr-defined]
            else:
                logits = self.forward(tokens)
        finally:
            for handle in handles:
                handle.remove()
        n = len(logits)
        feats = {layer: captured.get(layer, np.zeros((0, self.d_model), np.float32)) for layer in wanted}
        for layer, arr in feats.items():
            if arr.shape != (n, self.d_model):
                raise TargetContractError(
                    f"{self.name}: decoder layer {layer} produced features of shape {arr.shape}, expected "
                    f"({n}, {self.d_model})"
                )
        return logits, feats, cks

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """An independent target in the same state over the *same* model object (its weights are never written;
        all per-sequence state lives in the cache), with its own snapshot identity."""
        clone = copy.copy(self)
        clone._cache = copy.deepcopy(self._cache, memo)
        clone._clock = copy.deepcopy(self._clock, memo)
        clone._id = next_target_id()
        if "forward_with_checkpoints" in clone.__dict__:  # a bound method: bind it to the clone
            clone.forward_with_checkpoints = clone._forward_with_checkpoints
        return clone

    # ----------------------------------------------------------------- info

    def describe(self) -> str:
        """One line: architecture, layer kinds, vocabulary, context, parameter count."""
        kinds = "+".join("attn" if type(x) is self._kv_layer else "state" for x in self._cache.layers)
        params = sum(int(p.numel()) for p in self.model.parameters())
        dtype = self._dtype_name()
        return (
            f"{self.name}: transformers {type(self.model).__name__} layers={kinds} vocab={self.vocab_size} "
            f"max_context={self.max_context} params={params:,} dtype={dtype} "
            f"rollback={'checkpoint' if 'forward_with_checkpoints' in self.__dict__ else 'replay'}"
        )

    def __repr__(self) -> str:
        return f"<{self.describe()} processed={self._processed}>"

    def _dtype_name(self) -> str:
        return str(next(self.model.parameters()).dtype).replace("torch.", "")


# --------------------------------------------------------------------------- cache-layer helpers
# Module-level so the HFTarget class holds the protocol; each takes the torch module or a cache
# layer it is handed (transformers is imported only when an HFTarget is built).


def _capture_conv_inputs(layers: Sequence[Any], linear_layer: Any, captured: dict[int, Any]) -> list[int]:
    """Wrap each conv / recurrent layer's ``update_conv_state`` so the full conv input it builds is cloned into
    ``captured[layer index]``; returns the wrapped layers' indices (``del layer.update_conv_state`` undoes it)."""
    originals: list[int] = []
    for i, layer in enumerate(layers):
        if type(layer) is linear_layer:
            original = layer.update_conv_state

            def capture(conv_states: Any, *args: Any, _i: int = i, _orig: Any = original, **kwargs: Any) -> Any:
                full = _orig(conv_states, *args, **kwargs)
                captured[_i] = full.detach().clone()
                return full

            originals.append(i)
            layer.update_conv_state = capture
    return originals


def _states_at(torch: Any, after: Sequence[Any], captured: dict[int, Any], *, back: int) -> tuple[Any, ...]:
    """The layer states ``back`` positions before the end of a forward: each conv window sliced from the captured
    full conv input (left-padded with zeros when it reaches before the first column)."""
    states: list[Any] = []
    for i, state in enumerate(after):
        if state is None:
            states.append(None)
            continue
        current = state["conv"][0]
        full = captured[i]
        width = current.shape[-1]
        end = full.shape[-1] - back  # the window ends at this position's column
        window = full[..., max(0, end - width) : end]
        if window.shape[-1] < width:
            window = torch.nn.functional.pad(window, (width - window.shape[-1], 0))
        states.append({**state, "conv": {0: window.clone()}})
    return tuple(states)


def _linear_state(layer: Any) -> dict[str, Any]:
    """Clones of a ``LinearAttentionLayer``'s conv and recurrent tensors and copies of its flags."""
    return {
        "conv": {i: None if t is None else t.clone() for i, t in layer.conv_states.items()},
        "rec": {i: None if t is None else t.clone() for i, t in layer.recurrent_states.items()},
        "has_previous_state": dict(layer.has_previous_state),
        "conv_init": dict(layer.is_conv_states_initialized),
        "rec_init": dict(layer.is_recurrent_states_initialized),
    }


def _put_back_linear_state(layer: Any, state: dict[str, Any]) -> None:
    """Copy ``_linear_state``'s saved tensors and flags back into ``layer`` (in place where shapes allow)."""
    for key, saved in (("conv", layer.conv_states), ("rec", layer.recurrent_states)):
        for idx, tensor in state[key].items():
            current = saved.get(idx)
            if tensor is None:
                saved[idx] = None
            elif current is not None and current.shape == tensor.shape:
                current.copy_(tensor)  # keeps the tensor's address, as transformers does
            else:
                saved[idx] = tensor.clone()
    layer.has_previous_state.update(state["has_previous_state"])
    layer.is_conv_states_initialized.update(state["conv_init"])
    layer.is_recurrent_states_initialized.update(state["rec_init"])


def _feature_hook(torch: Any, layer: int, captured: dict[int, npt.NDArray[np.float32]]) -> Any:
    """A forward hook storing decoder layer ``layer``'s output (batch row 0, float32) in ``captured[layer]``."""

    def hook(_module: Any, _args: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        captured[layer] = hidden[0].to(torch.float32).cpu().numpy().copy()

    return hook


# --------------------------------------------------------------------------- tiny models


def _no_special_tokens(model: Any) -> Any:
    # a random model must not stop `generate` at an arbitrary id
    for cfg in (model.config, model.generation_config):
        for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
            setattr(cfg, key, None)
    return model.eval()


def _load_exact(model: Any, weights: dict[str, npt.NDArray[np.float32]], what: str) -> None:
    torch, _ = require_hf()
    params = dict(model.named_parameters())
    if set(params) != set(weights):
        odd = sorted(set(params) ^ set(weights))
        raise InvalidSettingError(f"{what}: weight names differ from the model's: {odd[:3]}")
    with torch.no_grad():
        for name, value in weights.items():
            if tuple(params[name].shape) != value.shape:
                raise InvalidSettingError(
                    f"{what}: {name!r} has shape {value.shape}, model needs {tuple(params[name].shape)}"
                )
            params[name].copy_(torch.from_numpy(np.array(value, dtype=np.float32, copy=True)))


def tiny_model(
    name: str, *, seed: int = 0, max_context: int = _DEFAULT_MAX_CONTEXT, trained: Callable[[int], Any] | None = None
) -> Any:
    """The transformers model of a built-in tiny config (seeded, float32, CPU, eval mode)."""
    torch, transformers = require_hf()
    if name == "lfm2-tiny":
        from specproof.engine.targets.convert import reference_to_hf_lfm2, tiny_lfm2_reference

        return _no_special_tokens(reference_to_hf_lfm2(tiny_lfm2_reference(seed=seed, max_context=max_context)))
    if name == "lfm2-trained":  # the committed trained fixture (issue 7), converted
        from specproof.engine.targets.convert import reference_to_hf_lfm2

        if trained is None:
            raise InvalidSettingError(
                "hf:lfm2-trained converts the trained fixture: load it through specproof.plugins.load_target"
            )
        return _no_special_tokens(reference_to_hf_lfm2(trained(max_context)))
    if name == "qwen3_5-tiny":
        from specproof.engine.targets.convert import tiny_qwen3_5_config, tiny_qwen3_5_weights

        cfg = {k: v for k, v in tiny_qwen3_5_config(max_context=max_context).items() if k != "model_type"}
        cfg.pop("full_attention_interval")
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**cfg)).to(torch.float32)
        _load_exact(model, tiny_qwen3_5_weights(seed=seed), "hf:qwen3_5-tiny")
        return _no_special_tokens(model)
    if name == "llama-tiny":
        config = transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_context,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        torch.manual_seed(seed)  # rank-1 tensors (norms) keep transformers' own initialisation
        model = transformers.LlamaForCausalLM(config).to(torch.float32)
        shapes = {k: tuple(p.shape) for k, p in model.named_parameters()}
        init = seeded_normal_init(shapes, seed=seed)
        init.update({k: p.detach().numpy().copy() for k, p in model.named_parameters() if k not in init})
        _load_exact(model, init, "hf:llama-tiny")
        return _no_special_tokens(model)
    raise InvalidSettingError(f"unknown tiny HF model {name!r}; known: {', '.join(TINY_MODELS)}")


def load_spec(args: str, *, trained: Callable[[int], Any] | None = None) -> HFTarget:
    """The ``hf:`` target family: ``hf:lfm2-tiny``, ``hf:qwen3_5-tiny``, ``hf:llama-tiny``
    (``,seed=N,max_context=N``), or ``hf:/local/path`` (offline)."""
    name, extra = parse_spec(args, family="hf", tiny=TINY_MODELS)
    if name is not None:
        assert isinstance(extra, dict)
        max_context = extra.get("max_context", _DEFAULT_MAX_CONTEXT)
        model = tiny_model(name, seed=extra.get("seed", 0), max_context=max_context, trained=trained)
        spec = f"hf:{name}" + "".join(f",{k}={v}" for k, v in sorted(extra.items()))
        return HFTarget(model, tokenizer=ByteTokenizer(256), max_context=max_context, name=spec)
    assert isinstance(extra, Path)
    _torch, transformers = require_hf()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(extra), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidSettingError(f"hf:{extra}: transformers could not load the model offline: {exc}") from exc
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(extra), local_files_only=True)
    except Exception:  # a checkpoint without tokenizer files: ids only, no encode/decode
        tokenizer = None
    return HFTarget(model, tokenizer=tokenizer, name=f"hf:{extra}")
