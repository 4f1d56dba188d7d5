"""A trace (JSON Lines): a header line, one line per round, a final line.
``specproof generate --trace`` writes it; ``specproof check-trace`` reads it."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID", "PARTS"]

ID: Final = "specproof-trace/1"
FORMAT: Final = JsonFormat(ID, "trace-1", indent=None)
#: the kinds of line, each a definition of the schema (``FORMAT.problems(line, part="round")``)
PARTS: Final = ("header", "round", "final")
