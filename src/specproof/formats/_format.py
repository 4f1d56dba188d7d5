"""``JsonFormat``: what every format module holds — the format id, its schema, and its one way
to write and read a document (atomically; bounded in size and depth; validated by name)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs

from specproof.contract.files import MAX_USER_FILE_BYTES, loads_bounded, read_bounded_text, write_text_file
from specproof.formats import _schema
from specproof.formats._schema import SchemaProblem

__all__ = ["JsonFormat"]


@attrs.frozen
class JsonFormat:
    """One JSON format specproof defines.

    ``id`` is the value of the document's ``field`` (``format``, or ``schema`` for the bench
    files; None for a bare JSON array, whose schema is its version); ``schema`` the name of its
    JSON Schema in ``specproof/schemas/``; ``max_bytes`` the largest file read back; ``indent``,
    ``sort_keys``, ``default`` how ``dumps``
    writes it (the bytes specproof has always written), or ``layout`` for a hand-laid one.
    """

    id: str
    schema: str
    field: Literal["format", "schema"] | None = "format"
    max_bytes: int = MAX_USER_FILE_BYTES
    indent: int | None = 2
    sort_keys: bool = False
    default: Any = None
    layout: Callable[[Any], str] | None = attrs.field(default=None, eq=False)

    def tag(self) -> dict[str, str]:
        """The field that names the format, to start a document with: ``{"format": id}``."""
        return {self.field: self.id} if self.field else {}

    def load_schema(self) -> dict[str, Any]:
        return _schema.load_schema(self.schema)

    def problems(self, doc: object, *, part: str | None = None) -> list[SchemaProblem]:
        """Every reason ``doc`` (or its ``$defs`` kind ``part``) does not match the schema; ``[]`` if valid."""
        return _schema.problems(self.schema, doc, part=part)

    def validate(self, doc: object, *, part: str | None = None) -> list[str]:
        """``problems`` as one-line strings naming the JSON path; ``[]`` when valid."""
        return _schema.validate(self.schema, doc, part=part)

    def dumps(self, doc: object) -> str:
        """The document as text, with its trailing newline."""
        if self.layout is not None:
            return self.layout(doc)
        return json.dumps(doc, indent=self.indent, sort_keys=self.sort_keys, default=self.default) + "\n"

    def write(self, path: str | os.PathLike[str], doc: object) -> Path:
        """Write ``doc`` to ``path`` atomically (``contract.files.write_text_file``)."""
        return write_text_file(path, self.dumps(doc))

    def read_text(self, path: str | os.PathLike[str]) -> str:
        """The file's text, at most ``max_bytes`` (``FileTooLargeError``, ``OSError``, ``UnicodeDecodeError``)."""
        return read_bounded_text(path, max_bytes=self.max_bytes)

    def loads(self, text: str) -> Any:
        """The JSON of ``text``, bounded in depth (``ValueError``; ``json.JSONDecodeError``); not validated."""
        return loads_bounded(text)
