"""Resolving command-line specs: targets, drafters and engines (docs/contract.md, "Engines").

This module sits above ``specproof.engine``, ``specproof.wire`` and ``specproof.fixtures``
and is the one place that knows all three; none of them imports it (tests/project/test_layers.py).

- ``load_target(spec)``: the engine's target families (``reference``, ``reference-moe``,
  ``reference:FIELD=V,...``, ``hf:``, ``mlx:``, ``coreml:``, ``coreml-eval:``, any ``register_target_family``
  prefix), the fixtures (``trained``, ``trained-small``; ``hf:lfm2-trained``/``mlx:lfm2-trained``
  convert ``trained``), the Core ML export families' sources (``family:NAME``), or ``MODULE:ATTRIBUTE``;
- ``drafter_factory(spec)`` / ``load_drafter(spec)``: ``ngram[:MIN_N,MAX_N[,recent|earliest]]``,
  ``model:TARGET``, ``combined:TARGET``, ``eagle:trained[,replay]``, ``mtp:trained``,
  ``suffix[:MIN_N,MAX_N]``, the tree drafters ``tree:SHAPE:DRAFTER`` and ``tree:ngram``, or
  ``MODULE:ATTRIBUTE`` (see ``DRAFTER_SPECS``);
- ``plugin_factory(spec, kind=...)`` / ``resolve_plugin(spec, kind=...)``: ``MODULE:ATTRIBUTE``,
  and for engines ``exec:CMD ARGS`` / ``tcp:HOST:PORT`` (``specproof-engine/1``), ``vllm:DIR,...`` and
  ``llamacpp:FILE,...`` (docs/real-engines.md).

``ngram``, ``model``, ``combined``, ``eagle``, ``mtp``, ``suffix`` and ``tree`` are reserved drafter prefixes:
a plug-in module of that name must be spelled as a longer dotted path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specproof.engine import (
    CombinedDrafter,
    Drafter,
    InvalidSettingError,
    ModelDrafter,
    NgramDrafter,
    PluginError,
    ReferenceHybrid,
    SpecproofError,
    Target,
)
from specproof.engine import plugin_modules as engine_plugins
from specproof.engine import targets as engine_targets
from specproof.engine.drafters import SuffixDrafter
from specproof.engine.drafters.trees import NgramTreeDrafter, TopKTreeDrafter, parse_tree_shape
from specproof.fixtures import load_head_drafter, load_trained_small_target, load_trained_target

__all__ = [
    "DRAFTER_SPECS",
    "FIXTURE_TARGETS",
    "drafter_factory",
    "load_drafter",
    "load_target",
    "plugin_factory",
    "resolve_plugin",
    "target_families",
]

DRAFTER_SPECS = (
    "ngram[:MIN_N,MAX_N]", "model:TARGET", "combined:TARGET", "eagle:trained", "mtp:trained", "suffix[:MIN_N,MAX_N]",
    "tree:SHAPE:DRAFTER", "tree:ngram", "MODULE:ATTRIBUTE",
)  # fmt: skip


def load_family_spec(args: str) -> ReferenceHybrid:
    """``family:NAME[,max_context=N]``: a Core ML export family's source model (imported on use)."""
    from specproof.coreml import load_family_spec as load

    return load(args)


#: target specs served by the packaged fixtures: prefix -> loader of the text after ``prefix:``
FIXTURE_TARGETS: dict[str, Callable[[str], ReferenceHybrid]] = {
    "trained": load_trained_target,
    "trained-small": load_trained_small_target,
    # the Core ML export families' source models (family:lfm2-moe[,max_context=N]; docs/coreml.md)
    "family": load_family_spec,
}

# External engines over specproof-engine/1.
_WIRE_PREFIXES = ("exec:", "tcp:")
# vLLM's offline LLM on a `specproof export vllm` checkpoint (specproof.engine.adapters.vllm).
_VLLM_PREFIX = "vllm:"
# llama.cpp's Llama (llama-cpp-python) on a GGUF file (specproof.engine.adapters.llamacpp).
_LLAMACPP_PREFIX = "llamacpp:"


def _trained_at(max_context: int) -> ReferenceHybrid:
    return load_trained_target(f"max_context={max_context}")


def target_families() -> tuple[str, ...]:
    """Every target spec prefix ``load_target`` knows (engine families and fixtures), sorted."""
    return tuple(sorted({*engine_targets.TARGET_FAMILIES, *FIXTURE_TARGETS}))


def load_target(spec: str) -> Target:
    """Build the target a spec names; ``PluginError`` naming the spec on a bad one."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"--target {spec!r}: expected a target spec such as 'reference' or 'mypkg.targets:make'")
    prefix, sep, rest = spec.partition(":")
    if prefix in FIXTURE_TARGETS:
        try:
            return FIXTURE_TARGETS[prefix](rest if sep else "")
        except InvalidSettingError as exc:
            raise PluginError(f"--target {spec!r}: {exc}") from exc
    if prefix in ("hf", "mlx") and engine_targets.TARGET_FAMILIES.get(prefix, "").startswith("specproof.engine."):
        # the built-in framework families: ``lfm2-trained`` converts the trained fixture
        if prefix == "hf":
            from specproof.engine.targets import hf as family
        else:
            from specproof.engine.targets import mlx as family  # type: ignore[no-redef]
        try:
            return family.load_spec(rest if sep else "", trained=_trained_at)
        except InvalidSettingError as exc:
            raise PluginError(f"--target {spec!r}: {exc}") from exc
    if not sep and prefix not in engine_targets.TARGET_FAMILIES:
        known = ", ".join(target_families())
        raise PluginError(f"--target {spec!r}: unknown target; known: {known}, or MODULE:ATTRIBUTE")
    return engine_targets.load_target(spec)


def _wire_engine_factory(spec: str, flag: str) -> Callable[[], object]:
    """A factory for an external engine; its handshake's ``model`` resolves through ``load_target``."""
    from specproof.wire import engine_from_spec

    try:
        make = engine_from_spec(spec, load_target=load_target)
    except SpecproofError as exc:
        raise PluginError(f"{flag} {spec!r}: {exc}") from exc

    def start() -> object:
        try:
            return make()
        except SpecproofError as exc:
            raise PluginError(f"{flag} {spec!r}: starting the engine failed: {exc}") from exc

    return start


def _vllm_engine_factory(spec: str, flag: str) -> Callable[[], object]:
    """``vllm:DIR[,OPTION=VALUE...]``: options checked and the oracle loaded now; vLLM started on the call."""
    from specproof.engine.adapters import vllm as adapter

    try:
        settings = adapter.parse_vllm_spec(spec[len(_VLLM_PREFIX) :])
        config = adapter.check_checkpoint(settings.model_dir)
        source = settings.oracle or (config.get("specproof") or {}).get("source")
        if not isinstance(source, str) or not source:
            raise PluginError(
                f"{flag} {spec!r}: the checkpoint names no source model; add oracle=TARGET (e.g. oracle=trained)"
            )
        oracle = load_target(source)
        adapter.require_vllm()
    except SpecproofError as exc:
        raise PluginError(f"{flag} {spec!r}: {exc}") from exc

    def start() -> object:
        try:
            return adapter.VLLMEngine(settings, oracle=oracle)
        except SpecproofError as exc:
            raise PluginError(f"{flag} {spec!r}: {exc}") from exc

    return start


def _llamacpp_engine_factory(spec: str, flag: str) -> Callable[[], object]:
    """``llamacpp:FILE[,OPTION=VALUE...]``: options, file and oracle checked now; llama.cpp loaded on the call."""
    from specproof.engine.adapters import llamacpp as adapter

    try:
        settings = adapter.parse_llamacpp_spec(spec[len(_LLAMACPP_PREFIX) :])
        meta = adapter.check_gguf_file(settings.model_path)
        source = settings.oracle or meta.get("specproof.source")
        if not isinstance(source, str) or not source:
            raise PluginError(
                f"{flag} {spec!r}: the GGUF file names no source model; add oracle=TARGET (e.g. oracle=trained)"
            )
        oracle = load_target(source)
        vocab = adapter.gguf_vocab_size(meta)
        adapter.resolve_n_ctx(settings, oracle)  # a capacity unlike the oracle's: refused before llama.cpp loads
        adapter.require_llama_cpp()
    except SpecproofError as exc:
        raise PluginError(f"{flag} {spec!r}: {exc}") from exc

    def start() -> object:
        try:
            return adapter.LlamaCppEngine(settings, oracle=oracle, vocab_size=vocab)
        except SpecproofError as exc:
            raise PluginError(f"{flag} {spec!r}: {exc}") from exc

    return start


def plugin_factory(spec: str, *, kind: str) -> Callable[[], object]:
    """A zero-argument callable that gives the ``kind`` ("drafter", "target", "engine") ``spec`` names.

    ``MODULE:ATTRIBUTE`` (a factory, called per instance, or an instance); for engines also
    ``exec:CMD ARGS``, ``tcp:HOST:PORT``, ``vllm:DIR[,OPTION=VALUE...]`` and ``llamacpp:FILE[,OPTION=VALUE...]``
    (docs/real-engines.md).
    """
    if kind == "engine" and isinstance(spec, str) and spec.startswith(_WIRE_PREFIXES):
        return _wire_engine_factory(spec, f"--{kind}")
    if kind == "engine" and isinstance(spec, str) and spec.startswith(_VLLM_PREFIX):
        return _vllm_engine_factory(spec, f"--{kind}")
    if kind == "engine" and isinstance(spec, str) and spec.startswith(_LLAMACPP_PREFIX):
        return _llamacpp_engine_factory(spec, f"--{kind}")
    return engine_plugins.plugin_factory(spec, kind=kind)


def resolve_plugin(spec: str, *, kind: str) -> object:
    """The instance ``plugin_factory(spec, kind=kind)`` makes."""
    return plugin_factory(spec, kind=kind)()


def _ngram_factory(spec: str, args: str) -> Callable[[], Drafter]:
    """``ngram:MIN_N,MAX_N[,recent|earliest]`` (the syntax ``specproof generate`` has always taken)."""
    parts = [p.strip() for p in args.split(",") if p.strip()]
    prefer = "earliest" if "earliest" in parts else "recent"
    try:
        nums = [int(p) for p in parts if p not in ("recent", "earliest")]
    except ValueError:
        raise PluginError(f"--drafter {spec!r}: expected ngram or ngram:MIN_N,MAX_N[,recent|earliest]") from None
    if len(nums) > 2:
        raise PluginError(f"--drafter {spec!r}: expected ngram or ngram:MIN_N,MAX_N[,recent|earliest]")
    min_n, max_n = (nums + [1, 3][len(nums) :])[:2]
    try:
        NgramDrafter(min_n=min_n, max_n=max_n, prefer=prefer)  # type: ignore[arg-type]
    except SpecproofError as exc:
        raise PluginError(f"--drafter {spec!r}: {exc}") from exc
    return lambda: NgramDrafter(min_n=min_n, max_n=max_n, prefer=prefer)  # type: ignore[arg-type]


def _model(spec: str, target_spec: str) -> ModelDrafter:
    if not target_spec.strip():
        raise PluginError(
            f"--drafter {spec!r}: expected a draft model target spec after the colon, e.g. model:trained-small"
        )
    try:
        model = load_target(target_spec)
    except SpecproofError as exc:
        raise PluginError(f"--drafter {spec!r}: cannot load the draft model {target_spec!r}: {exc}") from exc
    return ModelDrafter(model, name=f"specproof.ModelDrafter({target_spec})")


def drafter_factory(spec: str) -> Callable[[], Drafter]:
    """A zero-argument callable that makes a fresh drafter for ``spec`` (each call a new instance).

    The spec is checked (and a draft model loaded once) before this returns, so a bad spec
    raises ``PluginError`` naming it here, not later.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"--drafter {spec!r}: expected a drafter spec: {', '.join(DRAFTER_SPECS)}")
    prefix, sep, rest = spec.partition(":")
    if prefix == "ngram":
        return _ngram_factory(spec, rest)
    if prefix in ("model", "combined"):
        first = [_model(spec, rest)]  # load now, so a bad spec fails here; the first call gets this one

        def make() -> Drafter:
            model = first.pop() if first else _model(spec, rest)
            return model if prefix == "model" else CombinedDrafter(model)

        return make
    if prefix == "suffix":
        kwargs: dict[str, Any]
        try:
            nums = [int(p) for p in rest.split(",") if p.strip()]
            if len(nums) not in (0, 2):
                raise ValueError
            kwargs = dict(zip(("min_n", "max_n"), nums, strict=False))
            SuffixDrafter(**kwargs)
        except ValueError:
            raise PluginError(f"--drafter {spec!r}: expected suffix or suffix:MIN_N,MAX_N") from None
        except SpecproofError as exc:
            raise PluginError(f"--drafter {spec!r}: {exc}") from exc
        return lambda: SuffixDrafter(**kwargs)
    if prefix in ("eagle", "mtp"):
        try:
            load_head_drafter(prefix, rest)  # load now, so a bad spec fails here
        except SpecproofError as exc:
            raise PluginError(f"--drafter {spec!r}: {exc}") from exc
        return lambda: load_head_drafter(prefix, rest)
    if prefix == "tree":
        return _tree_factory(spec, rest)
    if sep:
        return plugin_factory(spec, kind="drafter")  # type: ignore[return-value]
    raise PluginError(f"--drafter {spec!r}: unknown drafter; expected {', '.join(DRAFTER_SPECS)}")


def _tree_factory(spec: str, rest: str) -> Callable[[], Drafter]:
    """``tree:ngram`` or ``tree:SHAPE:DRAFTER`` (SHAPE ``2x2x2``, ``4-2-1``, ``dynamic:16[,k=4]``; DRAFTER a
    ``model:``, ``eagle:`` or ``mtp:`` spec): a tree drafter (docs/contract.md, "Trees")."""
    if rest == "ngram":
        return NgramTreeDrafter  # type: ignore[return-value]
    shape_text, _, inner = rest.partition(":")
    if shape_text == "dynamic":
        budget, _, inner = inner.partition(":")
        shape_text = f"dynamic:{budget}"
    usage = (
        "expected tree:ngram or tree:SHAPE:DRAFTER (a model:, eagle: or mtp: spec), e.g. "
        "tree:2x2x2:model:trained-small or tree:dynamic:16:eagle:trained"
    )
    if inner.partition(":")[0] not in ("model", "eagle", "mtp"):
        raise PluginError(f"--drafter {spec!r}: {usage}")
    try:
        shape = parse_tree_shape(shape_text)
        make_chain = drafter_factory(inner)
        TopKTreeDrafter(make_chain(), shape)  # type: ignore[arg-type]
    except SpecproofError as exc:
        raise PluginError(f"--drafter {spec!r}: {exc}") from exc
    return lambda: TopKTreeDrafter(make_chain(), shape)  # type: ignore[arg-type,return-value]


def load_drafter(spec: str) -> Drafter:
    """The drafter a spec names (see the module docstring); ``PluginError`` naming the spec on a bad one."""
    return drafter_factory(spec)()
