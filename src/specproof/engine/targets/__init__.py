"""Targets: the reference numpy hybrid, and adapters for MLX, transformers and Core ML.

``load_target(spec)`` turns a command-line target spec into a ``Target``:

- ``reference`` — the seeded default ``ReferenceHybrid``; ``reference-moe`` its
  mixture-of-experts variant; ``reference:d_model=32,max_context=256,...``
  overrides config fields (``layers=conv+attn+gdn``);
- ``PREFIX:ARGS`` for a registered adapter family (``mlx:``, ``hf:``, ``coreml:``, ``coreml-eval:``),
  loaded lazily so a missing optional dependency only matters when it is used;
- a bare registered name;
- ``module:attribute`` — any plug-in (a factory or an instance).

The fixtures (``trained``, ``trained-small``) live above the engine: ``specproof.plugins.load_target``
knows them and every family here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from specproof.contract import Target
from specproof.contract.errors import InvalidSettingError, PluginError
from specproof.engine.plugin_modules import resolve_plugin

__all__ = ["TARGET_FAMILIES", "load_target", "register_target_family"]

# prefix -> "module:function"; the function takes the text after "prefix:" ("" for a bare name).
TARGET_FAMILIES: dict[str, str] = {
    "reference": "specproof.engine.targets.reference_spec:load",
    "reference-moe": "specproof.engine.targets.reference_spec:load_moe",
    "coreml": "specproof.engine.targets.coreml:load_spec",
    "coreml-eval": "specproof.engine.targets.coreml_eval_tree:load_spec",  # a tree bundle: a tree target
    "mlx": "specproof.engine.targets.mlx:load_spec",
    "hf": "specproof.engine.targets.hf:load_spec",
}


def register_target_family(prefix: str, loader: str) -> None:
    """Register ``prefix`` (``prefix`` or ``prefix:ARGS`` specs) to the ``module:function`` loader."""
    TARGET_FAMILIES[prefix] = loader


def _family_loader(path: str) -> Callable[[str], Target]:
    module_name, _, func = path.partition(":")
    return getattr(importlib.import_module(module_name), func)  # type: ignore[no-any-return]


def load_target(spec: str) -> Target:
    """Build the target a spec names; raises ``PluginError`` with a clear message on a bad spec."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"--target {spec!r}: expected a target spec such as 'reference' or 'mypkg.targets:make'")
    prefix, sep, rest = spec.partition(":")
    if prefix in TARGET_FAMILIES:
        loader = _family_loader(TARGET_FAMILIES[prefix])
        try:
            return loader(rest if sep else "")
        except InvalidSettingError as exc:
            raise PluginError(f"--target {spec!r}: {exc}") from exc
    if sep:
        return resolve_plugin(spec, kind="target")  # type: ignore[return-value]
    known = ", ".join(sorted(TARGET_FAMILIES))
    raise PluginError(f"--target {spec!r}: unknown target; known: {known}, or MODULE:ATTRIBUTE")
