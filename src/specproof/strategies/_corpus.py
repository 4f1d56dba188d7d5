"""Real text for the ``text`` context kind: CPython standard-library docstrings and source.

The text is read from the running interpreter (``importlib`` + ``inspect``), so nothing
is bundled or downloaded. It is built once per process and cached. Docstrings are
missing under ``python -OO`` and sources may be missing from stripped installs; each
module that cannot be read is skipped, and if nothing at all can be read a short
embedded passage keeps the kind usable.
"""

from __future__ import annotations

import functools
import importlib
import inspect

__all__ = ["CORPUS_MODULES", "corpus_bytes"]

# Pure-Python modules present in every CPython >= 3.10. Prose (docstrings) first, so a
# text context shrinks toward English; code (sources) after, for the repetitive,
# indentation-heavy token streams that n-gram drafters meet in practice.
CORPUS_MODULES: tuple[str, ...] = ("textwrap", "difflib", "heapq", "bisect", "fractions", "string", "json")
_SOURCE_MODULES: tuple[str, ...] = ("textwrap", "heapq", "bisect", "string")
_MAX_BYTES = 1 << 16  # 64 KiB: plenty of variety; bounds the memory and the offset range

_FALLBACK = (
    "Speculative decoding drafts several tokens cheaply and verifies them with one forward of the target "
    "model. The longest prefix of the draft that agrees with the target's own greedy choices is kept, plus "
    "one token the target chose itself; the rest is rolled back. On a hybrid model the recurrent state must "
    "be rolled back too, or every later token is computed from a state that never existed.\n"
)


def _docstrings(module: object) -> list[str]:
    texts: list[str] = []
    doc = inspect.getdoc(module)
    if doc:
        texts.append(doc)
    for name, member in sorted(vars(module).items()):
        if name.startswith("_") or not (inspect.isfunction(member) or inspect.isclass(member)):
            continue
        if getattr(member, "__module__", None) != getattr(module, "__name__", None):
            continue  # re-exported from elsewhere: skip, so the order does not depend on import details
        doc = inspect.getdoc(member)
        if doc:
            texts.append(doc)
    return texts


@functools.cache
def corpus_bytes() -> bytes:
    """The corpus as one UTF-8 byte string (at most 64 KiB), documents separated by blank lines."""
    parts: list[str] = []
    for name in CORPUS_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # pragma: no cover - every listed module is in the standard library
            continue
        parts.extend(_docstrings(module))
    for name in _SOURCE_MODULES:
        try:
            parts.append(inspect.getsource(importlib.import_module(name)))
        except (ImportError, OSError, TypeError):  # no .py file in this install
            continue
    if not parts:
        parts.append(_FALLBACK)
    data = "\n\n".join(parts).encode("utf-8")
    return data[:_MAX_BYTES]
