"""Hypothesis draws that depend on the seed and the strategies only, not on what the process imported.

Hypothesis (6.131 on) draws about 5% of its integers, floats, strings and bytes from constants: a
global pool, and the literals of every "local" module the process has imported (any module outside
site-packages and the standard library: specproof itself when installed editable, a user's plug-in
engine, a test file). Processes import different local modules (an xdist worker, a reproduce line
run alone, a plug-in's module), so one derandomized search drew different examples in each; even
the choice between the two pools spends randomness differently once the local pool is not empty.
Inside ``no_local_constants()`` every draw sees an empty local pool, as in a process that imported
no local module: the examples depend on the seed (or derandomization) and the strategies only.

How: Hypothesis' provider reads the local pool through ``providers._get_local_constants()`` and
caches each choice's permitted pools, (global, local), in ``providers.CONSTANTS_CACHE``. Both are
swapped while inside: the cache for one of our own, so no entry computed with local constants is
read and none of ours leaks out. These are private names, checked on entry: a Hypothesis that renamed
them is a clear error, never a silent difference (and tests/project/test_hypothesis_internals.py
pins their shape). A registered provider chosen by ``settings(backend=...)`` would be public API but
not the same search: under a non-default backend Hypothesis skips its DataTree (novel prefixes,
exhaustion) and replays failures on its own provider.

Process-wide while inside (a lock and a depth count, so nested and concurrent uses restore once, at
the last exit): a Hypothesis test another thread runs at that moment draws without local constants too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["no_local_constants"]

_LOOKUP = "_get_local_constants"
_CACHE = "CONSTANTS_CACHE"

_lock = threading.Lock()
_depth = 0
_saved: tuple[Any, Any] | None = None
_own_cache: Any = None  # the pools our draws see (global constants only): kept between runs


def _providers() -> Any:
    """Hypothesis' provider module, checked for the names swapped (a clear error if one is gone)."""
    import hypothesis

    providers: Any = None
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants  # noqa: F401 (what _empty_constants builds)
    except ImportError:
        providers = None
    lookup, cache = getattr(providers, _LOOKUP, None), getattr(providers, _CACHE, None)
    if not callable(lookup) or not isinstance(getattr(cache, "cache", None), dict):
        raise RuntimeError(
            f"Hypothesis {hypothesis.__version__} has no hypothesis.internal.conjecture.providers.{_LOOKUP}() "
            f"and {_CACHE} of the shape specproof swaps to draw without local constants, so specproof's "
            "derandomized searches would depend on the modules a process imported: a Hypothesis release "
            "specproof does not support yet (see tests/project/test_hypothesis_internals.py)"
        )
    return providers


def _empty_constants() -> Any:
    from hypothesis.internal.constants_ast import Constants

    return Constants()


@contextmanager
def no_local_constants() -> Iterator[None]:
    """Every Hypothesis draw inside sees no local constants (the global pool only)."""
    global _depth, _saved, _own_cache
    providers = _providers()
    with _lock:
        if _depth == 0:
            _saved = (getattr(providers, _LOOKUP), getattr(providers, _CACHE))
            if _own_cache is None:
                _own_cache = type(_saved[1])(1024)
            setattr(providers, _LOOKUP, _empty_constants)
            setattr(providers, _CACHE, _own_cache)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                setattr(providers, _LOOKUP, _saved[0])
                setattr(providers, _CACHE, _saved[1])
                _saved = None
