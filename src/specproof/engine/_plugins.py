"""Resolving ``module:attribute`` plug-ins (DESIGN.md: a factory called with no arguments, or an instance)."""

from __future__ import annotations

import importlib
import inspect

from specproof.engine.errors import PluginError

__all__ = ["resolve_plugin"]

# The method that marks an object as an instance of each kind, not a factory.
_MARKERS = {"drafter": "propose", "target": "forward", "engine": "generate"}


def resolve_plugin(spec: str, *, kind: str) -> object:
    """Import ``module:attribute`` and return the instance it names.

    ``kind`` ("drafter", "target" or "engine") is used in messages and to tell an
    instance (it has the kind's method) from a factory (called with no arguments).
    """
    flag = f"--{kind}"
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise PluginError(f"{flag} {spec!r}: expected MODULE:ATTRIBUTE, for example mypkg.drafters:make")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"{flag} {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:  # the plug-in's own import raised: report it as theirs
        raise PluginError(f"{flag} {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    obj: object = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{flag} {spec!r}: module {module_name!r} has no attribute {attr_path!r}") from None
    marker = _MARKERS.get(kind)
    is_instance = marker is not None and not inspect.isclass(obj) and callable(getattr(obj, marker, None))
    if not is_instance:
        if not callable(obj):
            raise PluginError(f"{flag} {spec!r}: {attr_path!r} is neither a {kind} nor a factory that makes one")
        try:
            obj = obj()
        except Exception as exc:
            raise PluginError(
                f"{flag} {spec!r}: calling the factory {attr_path}() raised {type(exc).__name__}: {exc}"
            ) from exc
    if marker is not None and not callable(getattr(obj, marker, None)):
        raise PluginError(f"{flag} {spec!r}: the {kind} it made ({type(obj).__name__}) has no {marker}() method")
    return obj
