"""A trace (JSON Lines): a header line, one line per round, a final line.
``specproof generate --trace`` writes it; ``specproof check-trace`` reads it."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID", "MAX_BYTES", "PARTS"]

ID: Final = "specproof-trace/1"
#: the largest trace read back (a trace of a long run is a few MB)
MAX_BYTES: Final = 256 << 20
FORMAT: Final = JsonFormat(ID, "trace-1", max_bytes=MAX_BYTES, indent=None)
#: the kinds of line, each a definition of the schema (``FORMAT.problems(line, part="round")``)
PARTS: Final = ("header", "round", "final")
