"""Resolving ``module:attribute`` plug-ins: a factory called with no arguments, or an instance.

The command-line specs (``exec:``, ``tcp:``, fixtures, drafter prefixes) resolve in
``specproof.plugins``, above this package.

docs/contract.md ("Engines") is the reference.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType

from specproof.contract.errors import PluginError

__all__ = [
    "declared_capabilities",
    "import_plugin_module",
    "plugin_factory",
    "plugin_directory",
    "resolve_plugin",
    "takes_suite_drafts",
]

# Plug-in modules found in the working directory (not on sys.path until a spec needed it): name -> directory.
_FOUND_IN: dict[str, str] = {}


def import_plugin_module(name: str) -> ModuleType:
    """Import a plug-in's module; as ``python -m`` and pytest do, the working directory is searched too.

    The working directory is appended to ``sys.path`` (after everything installed, so it never
    shadows a package) only when the module is not found otherwise; ``plugin_directory`` then
    names it, for the reproduce lines. Spawned workers inherit the parent's ``sys.path``.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = name.split(".")[0]
        cwd = os.getcwd()
        if exc.name not in (top, name) or cwd in [os.path.abspath(p or os.curdir) for p in sys.path]:
            raise
        sys.path.append(cwd)
        importlib.invalidate_caches()
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as again:
            if again.name in (top, name):
                sys.path.remove(cwd)
                raise ModuleNotFoundError(
                    f"{again} (searched the installed packages and the working directory {cwd})", name=again.name
                ) from None
            raise
        _FOUND_IN[name] = cwd
        return module


def plugin_directory(spec: object) -> str | None:
    """The working directory the module of ``spec`` (``module:attribute``) was found in by
    ``import_plugin_module``; None when it was importable without it (installed, on ``PYTHONPATH``)."""
    if not isinstance(spec, str):
        return None
    return _FOUND_IN.get(spec.partition(":")[0])


# The method that marks an object as an instance of each kind, not a factory.
_MARKERS = {"drafter": "propose", "target": "forward", "engine": "generate"}


def plugin_factory(spec: str, *, kind: str) -> Callable[[], object]:
    """Import ``module:attribute`` and return a zero-argument callable that gives the instance.

    A factory attribute is returned wrapped so each call makes a new instance and
    errors name the plug-in; an instance attribute is returned by every call.
    """
    flag = f"--{kind}"
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise PluginError(f"{flag} {spec!r}: expected MODULE:ATTRIBUTE, for example mypkg.drafters:make")
    try:
        module = import_plugin_module(module_name)
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

    def checked(made: object) -> object:
        if marker is not None and not callable(getattr(made, marker, None)):
            raise PluginError(f"{flag} {spec!r}: the {kind} it made ({type(made).__name__}) has no {marker}() method")
        return made

    if marker is not None and not inspect.isclass(obj) and callable(getattr(obj, marker, None)):
        instance = obj
        return lambda: instance
    if not callable(obj):
        raise PluginError(f"{flag} {spec!r}: {attr_path!r} is neither a {kind} nor a factory that makes one")
    factory = obj

    def make() -> object:
        try:
            made = factory()
        except Exception as exc:
            raise PluginError(
                f"{flag} {spec!r}: calling the factory {attr_path}() raised {type(exc).__name__}: {exc}"
            ) from exc
        return checked(made)

    return make


def resolve_plugin(spec: str, *, kind: str) -> object:
    """Import ``module:attribute`` and return the instance it names (calling a factory with no arguments).

    ``kind`` ("drafter", "target" or "engine") is used in messages and to tell an
    instance (it has the kind's method) from a factory.
    """
    return plugin_factory(spec, kind=kind)()


def declared_capabilities(engine: object) -> frozenset[str] | None:
    """The capabilities an engine declares (``capabilities``: strings; a wire engine's come from its
    handshake), or None when it declares none and what it exposes says what it can do."""
    declared = getattr(engine, "capabilities", None)
    if declared is None or callable(declared) or isinstance(declared, (str, bytes)):
        return None
    try:
        names = frozenset(declared)
    except TypeError:
        return None
    return names if all(isinstance(n, str) for n in names) else None


def takes_suite_drafts(engine: object) -> bool:
    """Whether the suite may drive the engine's drafts: a ``drafter`` attribute, and ``suite_drafts``
    among its capabilities when it declares any (docs/contract.md, engines)."""
    declared = declared_capabilities(engine)
    return hasattr(engine, "drafter") and (declared is None or "suite_drafts" in declared)
