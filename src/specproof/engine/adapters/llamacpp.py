"""``LlamaCppEngine``: llama.cpp (through ``llama-cpp-python``'s ``Llama``) as a black-box ``Engine``.

The command-line spec is ``llamacpp:FILE[,OPTION=VALUE...]`` (``specproof.plugins`` resolves it),
where ``FILE`` is a GGUF file, e.g. the one ``specproof export gguf DIR`` writes. Options
(``LlamaCppSettings``, all validated in ``parse_llamacpp_spec``):

- ``speculative=none`` (default: plain greedy) | ``lookup:K[:NGRAM]``: llama-cpp-python's
  prompt-lookup draft model, ``LlamaPromptLookupDecoding(num_pred_tokens=K, max_ngram_size=NGRAM)``
  (``NGRAM`` default 2, the library's default);
- ``n_rs_seq=N`` (default 0, llama.cpp's default): the context parameter ``n_rs_seq``, the number of
  recurrent-state snapshots kept per sequence so that up to ``N`` tokens can be rolled back
  (llama.cpp marks it experimental); ``Llama`` has no argument for it, so the adapter sets it in
  the context parameters ``Llama`` builds its context from and checks the context kept it;
- ``reuse=0`` (default) | ``1``: keep the ``Llama``'s state between ``generate`` calls, so
  ``Llama.generate`` reuses the longest cached prefix of the next prompt (llama-cpp-python's own
  behaviour; the engine then declares ``reuses_prefix`` and reports ``stats.prefix_reused``);
  ``0`` resets the ``Llama`` before every call;
- ``n_ctx=N`` (default: the oracle's ``max_context + 1``, so that the engine and its oracle have the same
  capacity, which ``engine.lossless`` assumes near a full context): the engine's ``max_context`` is
  ``N - 1``, which must equal the oracle's (``resolve_n_ctx``: another ``n_ctx`` is refused, naming
  ``oracle=TARGET:max_context=N-1``, as the ``vllm:`` engine refuses another ``max_model_len``);
  the ``Llama`` gets ``N`` rounded up to a multiple of 256, the size llama.cpp pads its context to;
- ``threads=N`` (default 1): ``n_threads`` and ``n_threads_batch``;
- ``kv_type=f32`` (default) | ``f16`` (llama.cpp's default): the KV cache's ``type_k`` / ``type_v``; with
  ``f16`` the fixture's logits move by up to ~4e-3 (float32: ~1e-5), past the tie tolerance;
- ``oracle=TARGET``: the target spec of the same model (default: the ``specproof.source`` the export
  recorded in the file);
- ``eos=ID`` (default: the file's): ``tokenizer.ggml.eos_token_id`` overridden (``kv_overrides``), the id llama.cpp
  treats as end of generation: its grammar sampler ends a complete grammar only on it, so a request with a
  grammar must end on it (the grammar check's requests end on id 0: ``eos=0``); nothing else reads it;
- ``parallel=N`` (default 1): ``N >= 2`` makes the context with ``N`` sequence slots (``n_seq_max``,
  one KV buffer shared by them, ``kv_unified``, ``N`` contexts long) and the engine a ``BatchEngine`` over them
  (``_llamacpp_batch``: several requests in one ``llama_decode``, greedy, ``certify --batches``);
  ``generate`` still decodes one request on sequence 0.

Decoding is greedy (``temp=0``, repeat penalty 1) on token ids (``Llama.generate``), or sampled with
``generate(..., sampling=SamplingParams(...))`` through llama.cpp's own sampler chain (the engine declares
``sampling`` and ``seeded``; ``--sampling`` certifies it): ``Llama.generate`` samples every position of a
verified draft with that chain and keeps a draft token only when it equals the sample (sample-and-match).
llama.cpp's chain runs top-k, top-p and min-p *before* its temperature; the contract divides by the
temperature first, so the adapter divides the logits itself (a logits processor, the chain's first
stage) and gives the chain ``temp=1``: the same ``p`` as the contract's. The seed is the request's
(``Llama.set_seed``), a fresh random one for an unseeded request. The adapter
stops at ``max_new_tokens`` or at the ``eos_token_id`` it is asked for, never at the model's own EOS.
llama-cpp-python reports neither rounds nor drafts, so ``steps`` is None and only the end-to-end
invariants apply (``engine.lossless`` against the ``oracle``, ``engine.stop``, ``engine.session``).
The adapter wraps the draft model to count what it drafted (cut to the context, as ``generate``
cuts it) and, of that, how much matches the tokens emitted (``stats.drafted`` / ``accepted``).
``stats.prefix_reused`` is the number of tokens the ``Llama`` already held when ``generate`` first
evaluated (``Llama.n_tokens`` at its first ``eval``), counted only as far as the prompt continues the
previous request's prompt and emitted tokens (llama.cpp also holds the drafts it verified past the
last emitted token, which no request sent).

With ``generate(..., decode=DecodeParams(...))`` the request's penalties and logit bias run as llama.cpp's own
samplers in the contract's order and its EOS ids and stop sequences end the stream (``_llamacpp_decode``;
``decode_features``); ``logprobs`` (and top-n alternatives) are read from a recording stage in that chain,
after the processors (``_llamacpp_logprobs``); a grammar is llama.cpp's grammar sampler on its GBNF translation
(``_llamacpp_grammar``); ``min_tokens``, bad words and a grammar without a faithful translation are refused with
``UnsupportedParameterError``.

The engine declares ``tie_tolerance = 1e-3`` (the float32 framework targets' tolerance: ggml sums in
another order than the reference); ``--tie-tolerance`` overrides it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
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
from specproof.contract.errors import InvalidSettingError, MissingDependencyError, TokenRangeError
from specproof.contract.validation import int_at_least
from specproof.engine.adapters import known_causes
from specproof.engine.adapters._llamacpp_batch import LlamaCppBatch, LookupDrafter
from specproof.engine.adapters._llamacpp_decode import (
    LLAMACPP_DECODE_FEATURES,
    build_decode_chain,
    check_llamacpp_decode,
    stop_reason_after,
)
from specproof.engine.adapters._llamacpp_grammar import (
    LlamaCppGrammar,
    check_grammar_eos,
    grammar_stage,
    translate_grammar,
)
from specproof.engine.adapters._llamacpp_logprobs import LogprobRecorder, logprobs_of_rows
from specproof.engine.conventions import check_prompt
from specproof.engine.targets._framework import default_tie_tolerance

__all__ = [
    "INSTALL_HINT",
    "LlamaCppEngine",
    "LlamaCppSettings",
    "check_gguf_file",
    "parse_llamacpp_spec",
    "require_llama_cpp",
    "resolve_n_ctx",
]

INSTALL_HINT = (
    "pip install 'specproof[llamacpp]' (llama-cpp-python 0.3.36, built from source: 15-30 minutes on 2 cores) "
    "— docs/real-engines.md"
)

_OPTIONS = ("speculative", "n_rs_seq", "reuse", "n_ctx", "threads", "kv_type", "oracle", "parallel", "eos")
#: llama.cpp rounds the context size up to a multiple of this (llama_n_ctx)
CONTEXT_PAD = 256
#: ``kv_type`` -> ggml type id (``GGML_TYPE_F32`` 0, ``GGML_TYPE_F16`` 1)
KV_TYPES = {"f32": 0, "f16": 1}
#: llama.cpp's LLAMA_MAX_SEQ (llama_max_parallel_sequences)
MAX_PARALLEL = 256
#: tokens one llama_decode takes (Llama's n_batch, the binding's default): with parallel, every row's
#: last token and draft must fit one decode
N_BATCH = 512


def _flag(name: str, value: str) -> bool:
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise InvalidSettingError(f"llamacpp option {name}={value!r}: expected 0 or 1")


def _int(name: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidSettingError(f"llamacpp option {name}={value!r}: expected an integer >= {minimum}") from None
    if number < minimum:
        raise InvalidSettingError(f"llamacpp option {name}={value!r}: expected an integer >= {minimum}")
    return number


@attrs.frozen(kw_only=True)
class LlamaCppSettings:
    """One llama.cpp configuration; ``parse_llamacpp_spec`` builds it from ``llamacpp:FILE,...``."""

    model_path: str
    lookup: int = 0  # K of prompt-lookup decoding; 0: plain greedy
    max_ngram: int = 2
    n_rs_seq: int = 0
    reuse: bool = False
    n_ctx: int | None = None  # None: the oracle's max_context + 1
    threads: int = 1
    kv_type: str = "f32"
    oracle: str | None = None
    parallel: int = 1  # sequence slots; >= 2: a BatchEngine over them
    eos: int | None = None  # overrides the GGUF's EOS id (llama.cpp's end of generation); None: the file's

    def short_name(self) -> str:
        """A short id for reports: ``llamacpp-greedy``, ``llamacpp-lookup4-rs4-reuse``."""
        name = "llamacpp-greedy" if not self.lookup else f"llamacpp-lookup{self.lookup}"
        if self.n_rs_seq:
            name += f"-rs{self.n_rs_seq}"
        if self.reuse:
            name += "-reuse"
        if self.kv_type != "f32":
            name += f"-kv{self.kv_type}"
        if self.parallel > 1:
            name += f"-par{self.parallel}"
        if self.eos is not None:
            name += f"-eos{self.eos}"
        return name

    def describe(self) -> str:
        spec = "greedy" if not self.lookup else f"lookup:{self.lookup}:{self.max_ngram}"
        parallel = f",parallel={self.parallel}" if self.parallel > 1 else ""
        parallel += f",eos={self.eos}" if self.eos is not None else ""
        return (
            f"llamacpp[{spec},n_rs_seq={self.n_rs_seq},reuse={int(self.reuse)},n_ctx={self.n_ctx or 'auto'},"
            f"kv_type={self.kv_type}{parallel}]"
        )


def parse_llamacpp_spec(text: str) -> LlamaCppSettings:
    """``FILE[,OPTION=VALUE...]`` (the text after ``llamacpp:``) -> ``LlamaCppSettings``;
    ``InvalidSettingError`` naming the bad option. The file is not read here (``check_gguf_file``)."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not parts[0]:
        raise InvalidSettingError(
            "llamacpp: expected llamacpp:FILE[,OPTION=VALUE...] with FILE a GGUF file (`specproof export gguf DIR`)"
        )
    fields: dict[str, Any] = {}
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise InvalidSettingError(
                f"llamacpp option {part!r}: expected OPTION=VALUE; options: {', '.join(_OPTIONS)}"
            )
        if key == "speculative":
            fields.update(_parse_speculative(value))
        elif key == "reuse":
            fields[key] = _flag(key, value)
        elif key == "n_rs_seq":
            fields[key] = _int(key, value, 0)
        elif key == "n_ctx":
            fields[key] = _int(key, value, 2)
        elif key == "threads":
            fields[key] = _int(key, value, 1)
        elif key == "eos":
            fields[key] = _int(key, value, 0)
        elif key == "parallel":
            fields[key] = _int(key, value, 1)
            if fields[key] > MAX_PARALLEL:
                raise InvalidSettingError(f"llamacpp option parallel={value!r}: at most {MAX_PARALLEL} sequences")
        elif key == "kv_type":
            if value not in KV_TYPES:
                raise InvalidSettingError(f"llamacpp option kv_type={value!r}: expected f32 or f16")
            fields[key] = value
        elif key == "oracle":
            fields[key] = value
        else:
            raise InvalidSettingError(f"llamacpp option {key!r} is unknown; options: {', '.join(_OPTIONS)}")
    settings = LlamaCppSettings(model_path=str(Path(parts[0]).expanduser().resolve()), **fields)
    row = settings.lookup + 1
    if settings.parallel > 1 and settings.parallel * row > N_BATCH:
        raise InvalidSettingError(
            f"llamacpp option parallel={settings.parallel}: rows of up to K+1={row} judged tokens each exceed one "
            f"llama_decode (n_batch={N_BATCH}); give at most parallel={N_BATCH // row}"
        )
    return settings


def _parse_speculative(value: str) -> dict[str, int]:
    if value == "none":
        return {"lookup": 0}
    method, *nums = value.split(":")
    usage = f"llamacpp option speculative={value!r}: expected none or lookup:K[:NGRAM]"
    if method != "lookup" or len(nums) not in (1, 2):
        raise InvalidSettingError(usage)
    try:
        ints = [int(n) for n in nums]
    except ValueError:
        raise InvalidSettingError(usage) from None
    if ints[0] < 1:
        raise InvalidSettingError(f"llamacpp option speculative={value!r}: K must be >= 1")
    if len(ints) == 2 and ints[1] < 1:
        raise InvalidSettingError(f"llamacpp option speculative={value!r}: NGRAM must be >= 1")
    return {"lookup": ints[0], "max_ngram": ints[1] if len(ints) == 2 else 2}


def check_gguf_file(path: str) -> dict[str, Any]:
    """The GGUF file's metadata (strings and scalars), or ``InvalidSettingError`` saying why it is no model file."""
    from specproof.engine.targets.lfm2_gguf import read_gguf_metadata

    export = "write one with `specproof export gguf DIR`"
    if not Path(path).is_file():
        raise InvalidSettingError(f"llamacpp:{path}: no such file; {export}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise InvalidSettingError(f"llamacpp:{path}: not a GGUF file (it starts {magic!r}); {export}")
    meta = dict(read_gguf_metadata(path))
    if not isinstance(meta.get("general.architecture"), str):
        raise InvalidSettingError(f"llamacpp:{path}: the GGUF names no general.architecture; {export}")
    return meta


def gguf_vocab_size(meta: dict[str, Any]) -> int | None:
    """``{arch}.vocab_size`` of a GGUF's metadata, if it says."""
    value = meta.get(f"{meta.get('general.architecture')}.vocab_size")
    return int(value) if isinstance(value, int) else None


def require_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or ``MissingDependencyError`` naming the extra."""
    try:
        import llama_cpp
        import llama_cpp._internals
        import llama_cpp.llama
        import llama_cpp.llama_speculative
    except ImportError as exc:
        raise MissingDependencyError(
            f"the llamacpp: engine needs llama-cpp-python, which is not importable ({exc}): {INSTALL_HINT}"
        ) from exc
    return llama_cpp


def resolve_n_ctx(settings: LlamaCppSettings, oracle: Any) -> int:
    """The engine's ``max_context`` for ``settings`` with this ``oracle``: the oracle's; an explicit ``n_ctx``
    must hold exactly that (``n_ctx - 1`` tokens), or ``InvalidSettingError`` names the two ways out.

    ``engine.lossless`` compares the engine with plain greedy decoding in the oracle's context: an engine
    that holds fewer tokens stops full where greedy runs on, one that holds more runs on where the oracle
    cannot follow, and either fails on the rare prompt near the end (docs/real-engines.md, the vLLM
    capacity finding)."""
    capacity = getattr(oracle, "max_context", None)
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise InvalidSettingError(
            f"llamacpp:{settings.model_path}: the oracle states no max_context ({capacity!r}), so llama.cpp's "
            "capacity cannot match it; name a Target of the same model with oracle=TARGET"
        )
    if settings.n_ctx is None:
        return capacity
    if settings.n_ctx - 1 != capacity:
        n = settings.n_ctx
        raise InvalidSettingError(
            f"llamacpp option n_ctx={n}: the engine would hold {n - 1} tokens but its oracle holds {capacity}, "
            f"so plain greedy would not stop where llama.cpp does; drop n_ctx (default {capacity + 1}) "
            f"or name an oracle of that capacity: oracle=TARGET:max_context={n - 1}"
        )
    return capacity


def _sampling_kwargs(sampling: SamplingParams | None) -> dict[str, Any]:
    """``Llama.generate``'s sampler arguments for ``sampling``: greedy (``temp=0``, llama.cpp's greedy
    sampler), or its chain top-k, top-p, min-p, temperature: as is where top-p and min-p are off (top-k
    commutes with the temperature) or the temperature is 1, else with temperature 1 after the adapter's
    own division by the temperature (``_Temperature``), the contract's order; typical-p and penalties off."""
    off = {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "typical_p": 1.0}
    if sampling is None or sampling.greedy:
        return {"temp": 0.0, **off}
    kept = {"top_k": sampling.top_k, "top_p": sampling.top_p, "min_p": sampling.min_p}  # 0, 1, 0: off in both
    if (sampling.top_p >= 1.0 and sampling.min_p <= 0.0) or sampling.temperature == 1.0:
        # top-k commutes with the temperature: llama.cpp's own order gives the contract's p
        return {"temp": float(sampling.temperature), **kept, **off}
    return {"temp": 1.0, **kept, "logits_processor": [_Temperature(sampling.temperature)], **off}


class _Temperature:
    """The contract's first step, ``z = logits / temperature``, as llama-cpp-python's logits processor
    (the first stage of the sampler chain it builds, before top-k/top-p/min-p)."""

    def __init__(self, temperature: float) -> None:
        self.temperature = float(temperature)

    def __call__(self, input_ids: Any, logits: Any) -> Any:
        return logits / self.temperature


class _CountingDraft:
    """Wraps llama-cpp-python's draft model: the drafts it made, each ``(position, tokens)``, as
    ``Llama.generate`` uses them (cut to the room left in the context)."""

    def __init__(self, inner: Any, n_ctx: int) -> None:
        self.inner = inner
        self.n_ctx = n_ctx
        self.rounds: list[tuple[int, list[int]]] = []

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        draft = self.inner(input_ids, **kwargs)
        at = len(input_ids)
        self.rounds.append((at, [int(t) for t in draft[: max(self.n_ctx - at, 0)]]))
        return draft


def _build_llama(llama_cpp: Any, settings: LlamaCppSettings, draft: Any, n_ctx: int) -> Any:
    """``llama_cpp.Llama`` on the settings; ``n_rs_seq`` (and, for ``parallel``, ``n_seq_max`` and
    ``kv_unified``) go into the context parameters ``Llama`` starts from (it has no argument for them)
    and are checked on the context it built."""
    low = llama_cpp.llama.llama_cpp  # the ctypes module Llama.__init__ calls
    original = low.llama_context_default_params

    def with_rs_seq() -> Any:
        params = original()
        params.n_rs_seq = settings.n_rs_seq
        if settings.parallel > 1:
            params.n_seq_max = settings.parallel
            params.kv_unified = True  # one KV buffer: any sequence may use the whole context
        return params

    low.llama_context_default_params = with_rs_seq
    try:
        llm = llama_cpp.Llama(
            model_path=settings.model_path,
            n_ctx=n_ctx,
            # with a draft model Llama computes logits for every position (_logits_all) but sizes its
            # `scores` buffer by this argument: without it a prompt longer than n_batch (512) fails with
            # "could not broadcast input array ... into shape (0,)" (docs/real-engines.md)
            logits_all=draft is not None,
            n_batch=N_BATCH,
            n_threads=settings.threads,
            n_threads_batch=settings.threads,
            draft_model=draft,
            type_k=KV_TYPES[settings.kv_type],
            type_v=KV_TYPES[settings.kv_type],
            seed=0,
            kv_overrides=None if settings.eos is None else {"tokenizer.ggml.eos_token_id": settings.eos},
            verbose=False,
        )
    except Exception as exc:  # ValueError (no such model), RuntimeError (llama.cpp refused it) ...
        first = (str(exc).splitlines() or [""])[0][:300]
        raise InvalidSettingError(
            f"llama.cpp refused {settings.describe()} on {settings.model_path}: {type(exc).__name__}: {first}"
        ) from None
    finally:
        low.llama_context_default_params = original
    held = int(low.llama_n_rs_seq(llm._ctx.ctx))
    if held != settings.n_rs_seq:
        llm.close()
        raise InvalidSettingError(
            f"llama.cpp kept n_rs_seq={held}, not the {settings.n_rs_seq} asked for (the model's architecture does "
            "not support recurrent rollback); drop the n_rs_seq option"
        )
    slots = int(low.llama_n_seq_max(llm._ctx.ctx))
    if slots != settings.parallel:
        llm.close()
        raise InvalidSettingError(f"llama.cpp kept n_seq_max={slots}, not the parallel={settings.parallel} asked for")
    return llm


def _check_eos(settings: LlamaCppSettings, vocab: int) -> None:
    if settings.eos is not None and settings.eos >= vocab:
        raise InvalidSettingError(f"llamacpp option eos={settings.eos}: not a token id in [0, {vocab})")


def _eog_ids(low: Any, llm: Any, vocab: int) -> frozenset[int]:
    """The ids llama.cpp's grammar sampler lets a complete grammar end on (``llama_vocab_is_eog``)."""
    return frozenset(t for t in range(vocab) if low.llama_vocab_is_eog(llm._model.vocab, t))


class LlamaCppEngine:
    """A black-box ``Engine`` over ``llama_cpp.Llama.generate`` (greedy, token ids in and out).

    ``LlamaCppEngine(settings, *, oracle)``: ``oracle`` is a Target of the same model (the reference
    the file was exported from), never decoded on here, so ``engine.lossless`` compares llama.cpp with
    plain greedy decoding of that model.
    """

    # black box: no suite drafts, no state; it samples through llama.cpp's sampler chain (sample-and-match
    # over its own drafts) with a per-request seed (``Llama.set_seed``: one output per seed)
    capabilities: frozenset[str] = frozenset({"sampling", "seeded"})
    # generate(..., decode=DecodeParams): penalties and logit bias as llama.cpp's own samplers, stops cut by the
    # adapter as create_completion cuts its strings (``_llamacpp_decode``); min_tokens and bad_words refused
    decode_features: tuple[str, ...] = LLAMACPP_DECODE_FEATURES

    def __init__(self, settings: LlamaCppSettings, *, oracle: Any, vocab_size: int | None = None) -> None:
        if not isinstance(settings, LlamaCppSettings):
            raise InvalidSettingError(
                f"LlamaCppEngine settings must be LlamaCppSettings, got {type(settings).__name__}"
            )
        vocab = getattr(oracle, "vocab_size", None)
        if not isinstance(vocab, int) or (vocab_size is not None and vocab != vocab_size):
            raise InvalidSettingError(
                f"llamacpp:{settings.model_path}: the oracle's vocab_size {vocab!r} is not the file's "
                f"{vocab_size!r}; name the right model with oracle=TARGET"
            )
        self.max_context: int = resolve_n_ctx(settings, oracle)  # before llama.cpp loads anything
        _check_eos(settings, vocab)
        llama_cpp = require_llama_cpp()
        self.settings = settings
        self.oracle = oracle
        self.tie_tolerance: float = default_tie_tolerance("float32")
        self.vocab_size: int = vocab
        # llama.cpp pads the context to a multiple of 256 and Llama.generate cuts drafts to that padded size,
        # but Llama sizes its input_ids buffer by the n_ctx it was given: ask for the padded size, or a draft
        # near the end of the context overflows the buffer ("could not broadcast", docs/real-engines.md)
        # with parallel slots the cache is one buffer shared by them (kv_unified): room for every slot to reach
        # max_context at once, as a slot is promised
        n_ctx = -(-(self.max_context + 1) // CONTEXT_PAD) * CONTEXT_PAD * settings.parallel
        self.reuses_prefix: bool = settings.reuse
        inner = None
        if settings.lookup:
            self.k = settings.lookup
            inner = llama_cpp.llama_speculative.LlamaPromptLookupDecoding(
                max_ngram_size=settings.max_ngram, num_pred_tokens=settings.lookup
            )
            self._draft: _CountingDraft | None = _CountingDraft(inner, n_ctx)
        else:
            self.speculative = False  # plain greedy: certified as such (docs/contract.md, Engines)
            self._draft = None
        self.engine_name = settings.short_name()
        self.name = f"{settings.describe()} on {settings.model_path}"
        self.llm = _build_llama(llama_cpp, settings, self._draft, n_ctx)
        self.eog_ids = _eog_ids(llama_cpp.llama_cpp, self.llm, vocab)
        self._first_eval_at: int | None = None
        self._last_context: list[int] = []
        evaluate = self.llm.eval

        def eval_counting(tokens: Sequence[int]) -> None:
            if self._first_eval_at is None:
                self._first_eval_at = int(self.llm.n_tokens)
            evaluate(tokens)

        self.llm.eval = eval_counting  # an instance attribute: Llama.generate calls self.eval
        self._batch: LlamaCppBatch | None = None
        if settings.parallel > 1:
            try:
                self._batch = LlamaCppBatch(
                    self.llm,
                    low=llama_cpp.llama.llama_cpp,
                    slots=settings.parallel,
                    k=settings.lookup,
                    drafter=LookupDrafter(inner),
                    vocab_size=self.vocab_size,
                    max_context=self.max_context,
                    settings=settings.describe(),
                    n_rs_seq=settings.n_rs_seq,
                )
            except InvalidSettingError:
                self.llm.close()
                raise
            # an instance attribute, only with parallel >= 2: what the batch driver looks for
            self.batch_capabilities: BatchCapabilities = self._batch.capabilities
        # for the error message only: the rollbacks llama.cpp refused (llama_memory_seq_rm -> false) once
        # decoding began (a refused prefix reuse before it is handled: Llama.generate re-evaluates)
        self._refused: list[int] = []
        seq_rm = self.llm._ctx.kv_cache_seq_rm

        def seq_rm_watched(seq_id: int, p0: int, p1: int) -> bool:
            done = bool(seq_rm(seq_id, p0, p1))
            if not done and self._first_eval_at is not None:
                self._refused.append(int(p0))
            return done

        self.llm._ctx.kv_cache_seq_rm = seq_rm_watched

    def known_cause(self, invariant: str) -> str | None:
        """The known upstream cause (and workaround) of a failure of ``invariant`` on these settings, if the
        table of ``known_causes`` (docs/real-engines.md, "Known causes") has one: the certification adds it
        to the failure message."""
        row = known_causes.known_cause("llamacpp", self.settings, invariant)
        return row.sentence() if row is not None else None

    def __repr__(self) -> str:
        return f"LlamaCppEngine({self.name})"

    def reset(self) -> None:
        """Forget everything the ``Llama`` holds (its token history and its KV and recurrent memory)
        and, with ``parallel``, every batch request."""
        self.llm.reset()
        self._last_context = []
        if self._batch is not None:
            self._batch.reset()

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
        self.llm.close()

    # ------------------------------------------------------------------ the BatchEngine side (parallel >= 2)

    def _batched(self) -> LlamaCppBatch:
        if self._batch is None:
            raise InvalidSettingError(
                f"{self.settings.describe()} does not batch: give parallel=N (N >= 2 sequence slots) in the "
                "llamacpp: spec"
            )
        return self._batch

    def add_request(self, request: BatchRequest) -> None:
        """Queue a greedy request on one of the ``parallel`` sequence slots (docs/contract.md, "Batches")."""
        self._batched().add_request(request)
        self._last_context = []  # the batch clears what a session kept

    def step(self, *, only: Collection[str] | None = None) -> list[RequestOutput]:
        """One ``llama_decode`` over the running requests' rows (``only``: just those)."""
        return self._batched().step(only=only)

    def abort_request(self, request_id: str) -> Generation:
        return self._batched().abort_request(request_id)

    def preempt(self, request_id: str, *, mode: str) -> None:
        self._batched().preempt(request_id, mode=mode)

    def has_unfinished_requests(self) -> bool:
        return self._batch is not None and self._batch.has_unfinished_requests()

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        """Decode with ``Llama.generate``: greedily, or sampled at ``sampling`` through llama.cpp's sampler
        chain seeded with the request's ``seed``; ``stop_reason`` from the tokens it yielded. ``decode``: the
        request's penalties and logit bias as llama.cpp's samplers, its EOS ids and stop sequences
        (``_llamacpp_decode``; ``min_tokens`` and ``bad_words`` refused with ``UnsupportedParameterError``)."""
        ctx, n, decode = _checked_request(
            self.vocab_size, self.max_context, prompt, max_new_tokens, eos_token_id, sampling, decode
        )
        stops = decode if decode is not None else DecodeParams()
        eos_ids = stops.eos_set(eos_token_id)
        grammar: LlamaCppGrammar | None = None
        if decode is not None and decode.grammar is not None:  # refused before anything runs
            grammar = translate_grammar(decode.grammar, self.vocab_size)
            check_grammar_eos(eos_ids, self.eog_ids)
        if self.has_unfinished_requests():
            raise InvalidSettingError(
                "generate: batch requests are in flight on this engine (generate would clear their sequences); "
                "step them to the end or abort them first"
            )
        n_eff = min(n, self.max_context + 1 - len(ctx))
        if n_eff <= 0:
            self._first_eval_at = None
            if n == 0 and self.settings.reuse:
                self._prefill(ctx)  # a session keeps what it was sent, as for any other request
            stop: StopReason = "context_full" if n else "max_new_tokens"
            asked = decode is not None and decode.logprobs is not None
            return Generation(tokens=(), stop_reason=stop, stats=self._stats(ctx, []), logprobs=() if asked else None)
        if not self.settings.reuse:
            self.reset()
        if self._draft is not None:
            self._draft.rounds.clear()
        self._first_eval_at = None
        self._refused.clear()
        tokens: list[int] = []
        stop = "max_new_tokens"
        if sampling is not None and not sampling.greedy:
            # llama.cpp's dist sampler takes its 32-bit seed when generate builds the chain; an unseeded request
            # gets a fresh one. Reduced modulo 2**32 - 1: 0xFFFFFFFF is LLAMA_DEFAULT_SEED, "draw a random seed"
            seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(4), "little")
            self.llm.set_seed(int(seed) % 0xFFFFFFFF)
        recorder = None if decode is None else _install_decode_chain(self.llm, decode, ctx, sampling, grammar)
        stream = self.llm.generate(ctx, **_sampling_kwargs(sampling))
        try:
            for token in stream:
                tokens.append(int(token))
                ended = stop_reason_after(tokens, stops, eos_ids)
                if ended is not None:
                    stop = ended  # type: ignore[assignment]
                    break
                if len(tokens) == n_eff:
                    break
        except Exception as exc:  # llama_decode failures surface as RuntimeError
            raise self._failure(exc) from None
        finally:
            stream.close()
            self.llm.__dict__.pop("_init_sampler", None)
        if stop == "max_new_tokens" and n_eff < n and len(tokens) == n_eff:
            stop = "context_full"
        logprobs = None
        if recorder is not None and decode is not None:
            logprobs = logprobs_of_rows(recorder.rows, tokens, top_n=decode.logprobs or 0)
        return Generation(tokens=tokens, stop_reason=stop, stats=self._stats(ctx, tokens), logprobs=logprobs)

    def _failure(self, exc: BaseException) -> InvalidSettingError:
        """One line: what llama-cpp-python raised and, after a rollback llama.cpp refused, why and what to set."""
        first = (str(exc).splitlines() or [""])[0][:300]
        text = f"llama.cpp failed on {self.settings.describe()}: {type(exc).__name__}: {first}"
        if self._refused:
            text += (
                f" — llama.cpp refused to cut its memory back to position {self._refused[-1]} after a rejected "
                "draft (llama_memory_seq_rm returned false, which Llama.generate ignores), so the next decode "
                "started at a position its recurrent state had already passed"
            )
            if self.settings.lookup and self.settings.n_rs_seq < self.settings.lookup:
                text += f"; set n_rs_seq={self.settings.lookup} (at least the draft length K) to allow the rollback"
        return InvalidSettingError(text)

    def _prefill(self, ctx: list[int]) -> None:
        """Let ``Llama.generate`` take in ``ctx[:-1]`` (its one sampled token is dropped): a ``max_new_tokens=0``
        request on a session leaves the context but the pending token in the cache, as a longer one would."""
        if len(ctx) < 2:
            return
        stream = self.llm.generate(ctx[:-1], temp=0.0, repeat_penalty=1.0)
        try:
            next(stream)
        except Exception as exc:
            raise self._failure(exc) from None
        finally:
            stream.close()

    def _stats(self, ctx: list[int], tokens: list[int]) -> Stats:
        # what Llama already held when it first evaluated, counted only as far as the prompt continues the
        # previous request's context (its prompt and emitted tokens): the drafts llama.cpp verified past
        # the last emitted token are in its cache too, but no request ever sent them
        last, self._last_context = self._last_context, [*ctx, *tokens][:-1]
        shared = 0
        for a, b in zip(last, ctx[:-1]):
            if a != b:
                break
            shared += 1
        reused = min(self._first_eval_at or 0, shared)
        attempts: list[int] = []
        accepts: list[int] = []
        if self._draft is not None:
            full = [*ctx, *tokens]
            for at, draft in self._draft.rounds:
                attempts.extend([0] * (len(draft) - len(attempts)))
                accepts.extend([0] * (len(draft) - len(accepts)))
                kept = True
                for offset, token in enumerate(draft):
                    attempts[offset] += 1
                    kept = kept and at + offset < len(full) and full[at + offset] == token
                    accepts[offset] += kept
        return Stats(
            emitted=len(tokens),
            drafted=sum(attempts),
            accepted=sum(accepts),
            position_attempts=tuple(attempts),
            position_accepts=tuple(accepts),
            prefix_reused=reused,
        )


def _checked_request(
    vocab_size: int,
    max_context: int,
    prompt: Sequence[int],
    max_new_tokens: int,
    eos_token_id: int | None,
    sampling: SamplingParams | None,
    decode: DecodeParams | None,
) -> tuple[list[int], int, DecodeParams | None]:
    """``generate``'s arguments checked before anything runs: the prompt, the count and the decode
    parameters this engine honours (``check_llamacpp_decode`` refuses the rest by name)."""
    ctx = check_prompt(prompt, vocab_size=vocab_size, max_context=max_context)
    n = int_at_least(max_new_tokens, name="max_new_tokens", minimum=0, where="llamacpp engine")
    if eos_token_id is not None and not (
        isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) and 0 <= eos_token_id < vocab_size
    ):
        raise TokenRangeError(f"eos_token_id={eos_token_id!r} is not a token id in [0, {vocab_size})")
    if sampling is not None and not isinstance(sampling, SamplingParams):
        raise InvalidSettingError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
    if decode is not None:
        decode = check_llamacpp_decode(decode)
        decode.check_vocab(vocab_size)
    return ctx, n, decode


def _install_decode_chain(
    llm: Any,
    decode: DecodeParams,
    ctx: Sequence[int],
    sampling: SamplingParams | None,
    grammar: LlamaCppGrammar | None = None,
) -> LogprobRecorder | None:
    """The request's processors (and ``grammar``'s sampler) as llama.cpp's sampler chain for the next
    ``Llama.generate``; the recorder of the processed row of every pick where logprobs are asked
    (``_llamacpp_logprobs``)."""
    recorder = None
    if decode.logprobs is not None:
        recorder = LogprobRecorder(llm.n_vocab(), require_llama_cpp().llama_token_data)
    chain = build_decode_chain(
        require_llama_cpp()._internals, n_vocab=llm.n_vocab(), window=llm.n_ctx(), decode=decode,
        prompt=ctx, sampling=sampling, seed=llm._seed, recorder=recorder,
        grammar=None if grammar is None else grammar_stage(require_llama_cpp().llama_cpp, llm._model.vocab, grammar),
    )  # fmt: skip
    # Llama.generate builds its chain with _init_sampler: this call's is the decode chain (an instance
    # attribute over the method, removed after the call)
    llm._init_sampler = lambda **_: chain
    return recorder
