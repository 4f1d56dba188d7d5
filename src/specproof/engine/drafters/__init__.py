"""Drafters shipped with specproof, and ``load_drafter(spec)`` for command-line drafter specs.

Drafter specs (``--drafter``):

- ``ngram`` — prompt lookup (``NgramDrafter()``); ``ngram:MIN_N,MAX_N[,recent|earliest]``
  sets its fields (``ngram:2,4``, ``ngram:1,3,earliest``);
- ``model:TARGET`` — ``ModelDrafter`` over any target spec as the draft model:
  ``model:trained-small`` (the small draft model of the ``trained`` fixture),
  ``model:reference:d_model=32``, ``model:mlx:lfm2-tiny``, ``model:mypkg.targets:make``;
- ``combined:TARGET`` — ``CombinedDrafter``: prompt lookup (a match of >= 3 tokens) when it
  finds one, the draft model ``TARGET`` otherwise, and the model completes a lookup draft
  shorter than k; ``combined:trained-small``;
- ``eagle:trained`` / ``mtp:trained`` — feature heads (``HeadDrafter``: an EAGLE-3-style and an
  MTP-style head trained on the ``trained`` fixture's hidden states by ``scripts/train_heads.py``;
  docs/contract.md, "Feature drafters"); ``eagle:trained,replay`` rolls the head back by snapshot;
- ``suffix`` / ``suffix:MIN_N,MAX_N`` — ``SuffixDrafter``: longest-suffix matching over the session's
  earlier requests and outputs (a drafter that learns across calls: ``history_dependent``);
- ``MODULE:ATTRIBUTE`` — any plug-in (a factory or an instance).

``ngram``, ``model``, ``combined``, ``eagle``, ``mtp`` and ``suffix`` are reserved prefixes: a plug-in
module of that name must be spelled as a longer dotted path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from specproof.engine._plugins import plugin_factory
from specproof.engine._protocols import Drafter
from specproof.engine.drafters.combined import CombinedDrafter
from specproof.engine.drafters.heads import FeatureHead, HeadDrafter
from specproof.engine.drafters.model import DraftRollback, ModelDrafter
from specproof.engine.drafters.ngram import NgramDrafter, naive_ngram_propose
from specproof.engine.drafters.suffix import SuffixDrafter
from specproof.engine.errors import PluginError, SpecproofError

__all__ = [
    "DRAFTER_SPECS",
    "CombinedDrafter",
    "DraftRollback",
    "FeatureHead",
    "HeadDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "SuffixDrafter",
    "drafter_factory",
    "load_drafter",
    "naive_ngram_propose",
]

DRAFTER_SPECS = (
    "ngram[:MIN_N,MAX_N]", "model:TARGET", "combined:TARGET", "eagle:trained", "mtp:trained", "suffix[:MIN_N,MAX_N]",
    "MODULE:ATTRIBUTE",
)
# feature heads: prefix -> "module:function(kind, args)" (the fixtures layer builds them; imported lazily)
_HEAD_LOADER = "specproof.fixtures._feature_heads:load_head_drafter"


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
    from specproof.engine.targets import load_target

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
        module, _, func = _HEAD_LOADER.partition(":")
        loader = getattr(importlib.import_module(module), func)
        try:
            loader(prefix, rest)  # load now, so a bad spec fails here
        except SpecproofError as exc:
            raise PluginError(f"--drafter {spec!r}: {exc}") from exc
        return lambda: loader(prefix, rest)  # type: ignore[no-any-return]
    if sep:
        return plugin_factory(spec, kind="drafter")  # type: ignore[return-value]
    raise PluginError(f"--drafter {spec!r}: unknown drafter; expected {', '.join(DRAFTER_SPECS)}")


def load_drafter(spec: str) -> Drafter:
    """The drafter a spec names (see the module docstring); ``PluginError`` naming the spec on a bad one."""
    return drafter_factory(spec)()
