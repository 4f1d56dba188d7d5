"""The benchmark workloads, built from CPython's standard library as installed.

Every prompt is text that nobody on this project wrote: source code and docstrings
read from the running interpreter with ``inspect`` (``inspect.getsource`` /
``inspect.getdoc`` / ``inspect.signature``), cut by fixed rules, so a workload is
deterministic for a given interpreter version (the Python version is recorded with
every result, because a different CPython ships different text).

The four workloads are shapes of request a user recognises:

- ``code-edit``: a source file ending with ``textwrap.indent``, then "rewrite this
  function" and the function's opening lines, so a faithful continuation repeats
  most of the body;
- ``retrieval-qa``: a documentation passage, then a question and the start of an
  answer that quotes the passage;
- ``structured``: JSON Lines records of one schema (module, name, parameters,
  summary) describing standard-library functions, then the start of the next one;
- ``free-text``: a short passage and a request for new prose: little to copy.

The first three are *input-grounded* (the continuation can be found in the prompt);
``free-text`` is the control where prompt lookup has little to go on.
"""

from __future__ import annotations

import base64
import inspect
import json
import os
import string
import textwrap
from collections.abc import Sequence
from functools import lru_cache
from types import ModuleType
from typing import Final

import attrs

from specproof.contract import Target
from specproof.contract.errors import InvalidSettingError

__all__ = [
    "SOURCE_MODULES",
    "WORKLOAD_NAMES",
    "Workload",
    "build_workloads",
    "encode_text",
    "stdlib_token_stream",
]

WORKLOAD_NAMES: Final[tuple[str, ...]] = ("code-edit", "retrieval-qa", "structured", "free-text")
# The standard-library modules the workloads read. scripts/train_fixture.py never trains on their
# files, so the trained fixture's acceptance on a workload is not recall of a memorised prompt.
SOURCE_MODULES: Final[tuple[ModuleType, ...]] = (textwrap, json, string, base64)
_MIN_PROMPT_CHARS: Final = 200


@attrs.frozen(kw_only=True)
class Workload:
    """One benchmark prompt: its text, where the text came from, and whether it is input-grounded."""

    name: str
    text: str
    source: str  # e.g. "inspect.getsource(textwrap)": how to find the text again
    grounded: bool  # the continuation is expected to copy from the prompt

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "grounded": self.grounded, "chars": len(self.text)}


def _tail(text: str, chars: int) -> str:
    """The last ``chars`` characters of ``text``, starting at a line boundary."""
    if len(text) <= chars:
        return text
    cut = text[-chars:]
    nl = cut.find("\n")
    return cut[nl + 1 :] if 0 <= nl < len(cut) - 1 else cut


def _head(text: str, chars: int) -> str:
    """The first ``chars`` characters of ``text``, ending at a line boundary."""
    if len(text) <= chars:
        return text
    cut = text[:chars]
    nl = cut.rfind("\n")
    return cut[: nl + 1] if nl > 0 else cut


def _code_edit(chars: int) -> Workload:
    # The function to rewrite and the part of its file that comes before it: the file
    # is the context, the function (always whole) is what the user wants rewritten.
    module_src = inspect.getsource(textwrap)
    func_src = inspect.getsource(textwrap.indent)
    start = module_src.index(func_src)
    opening = "".join(func_src.splitlines(keepends=True)[:2])
    request = "\n\n# Rewrite `indent` above, same behaviour, with a clearer docstring:\n\n"
    before = max(chars - len(request) - len(opening) - len(func_src), 0)
    file_part = (_tail(module_src[:start], before) if before else "") + func_src
    return Workload(
        name="code-edit",
        text=file_part + request + opening,
        source="inspect.getsource(textwrap), ending with textwrap.indent",
        grounded=True,
    )


def _retrieval_qa(chars: int) -> Workload:
    doc = json.__doc__ or ""
    # The answer quotes the passage's third paragraph (how the module relates to marshal/pickle).
    paragraphs = [p for p in doc.split("\n\n") if p.strip()]
    quoted = paragraphs[1] if len(paragraphs) > 1 else paragraphs[0]
    words = quoted.split()
    request = (
        "\n\nQuestion: what does the passage say the json module's API is familiar to?\n"
        f'Answer, quoting the passage: "{" ".join(words[:4])}'
    )
    passage = _head(doc, max(chars - len(request), 0)).rstrip()
    return Workload(
        name="retrieval-qa",
        text="Passage (json.__doc__):\n" + passage + request,
        source="json.__doc__",
        grounded=True,
    )


def _records(modules: Sequence[ModuleType]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for module in modules:
        for name in sorted(vars(module)):
            obj = getattr(module, name)
            if name.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != module.__name__:
                continue
            try:
                params = list(inspect.signature(obj).parameters)
            except (TypeError, ValueError):  # pragma: no cover - functions always have one
                continue
            doc = inspect.getdoc(obj) or ""
            out.append(
                {
                    "module": module.__name__,
                    "name": name,
                    "params": params,
                    "summary": doc.splitlines()[0] if doc else "",
                }
            )
    return out


def _structured(chars: int) -> Workload:
    records = _records([base64, textwrap, string, json])
    lines = [json.dumps(r, ensure_ascii=True) for r in records]
    # The prompt ends by opening the first record, left out above: its schema (the keys,
    # the module) is in every line before it, its values are not.
    opening = '{"module": "' + str(records[0]["module"]) + '", "name": "'
    body = ""
    for line in lines[1:]:
        if len(body) + len(line) + 1 + len(opening) > chars:
            break
        body += line + "\n"
    return Workload(
        name="structured",
        text=body + opening,
        source="inspect.signature/getdoc of the public functions of base64, textwrap, string, json",
        grounded=True,
    )


def _free_text(chars: int) -> Workload:
    doc = inspect.getdoc(string) or ""
    first = doc.split("\n\n")[0]
    request = "\n\nIn a new paragraph of your own, say why a program might need such constants:\n"
    budget = max(min(chars, 400) - len(request), 0)
    return Workload(
        name="free-text",
        text=_head(first, budget).rstrip() + request,
        source="inspect.getdoc(string), first paragraph",
        grounded=False,
    )


_BUILDERS = {"code-edit": _code_edit, "retrieval-qa": _retrieval_qa, "structured": _structured, "free-text": _free_text}


def build_workloads(names: Sequence[str] = WORKLOAD_NAMES, *, prompt_chars: int = 800) -> list[Workload]:
    """Build the named workloads with prompts of about ``prompt_chars`` characters (free text stays short)."""
    if isinstance(prompt_chars, bool) or not isinstance(prompt_chars, int) or prompt_chars < _MIN_PROMPT_CHARS:
        raise InvalidSettingError(f"bench prompt_chars={prompt_chars!r} must be an integer >= {_MIN_PROMPT_CHARS}")
    out = []
    for name in names:
        if name not in _BUILDERS:
            raise InvalidSettingError(f"bench workload {name!r} is unknown; known: {', '.join(WORKLOAD_NAMES)}")
        out.append(_BUILDERS[name](prompt_chars))
    return out


def encode_text(target: Target, text: str) -> list[int]:
    """Token ids of ``text`` for ``target``: its own ``encode`` if it has one, else UTF-8 bytes."""
    encode = getattr(target, "encode", None)
    if callable(encode):
        return [int(t) for t in encode(text)]
    if target.vocab_size < 256:
        raise InvalidSettingError(
            f"bench: target vocab_size={target.vocab_size} is not byte-level and the target has no encode()"
        )
    return list(text.encode("utf-8"))


@lru_cache(maxsize=4)
def _stdlib_bytes(limit: int) -> bytes:
    # Standard-library source files in sorted order, from the directory the running
    # interpreter loaded ``textwrap`` from: the same bytes on every run of one CPython.
    root = os.path.dirname(inspect.getfile(textwrap))
    chunks: list[bytes] = []
    size = 0
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(root, name), "rb") as fh:
            data = fh.read()
        chunks.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


def stdlib_token_stream(n: int) -> list[int]:
    """``n`` byte tokens of concatenated standard-library source (drafter-cost contexts)."""
    data = _stdlib_bytes(n)
    if len(data) < n:
        raise InvalidSettingError(f"bench: the standard library here has only {len(data)} bytes of source, need {n}")
    return list(data)
