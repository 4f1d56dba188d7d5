"""What ``specproof generate --json`` prints: the tokens, the stop reason, the rounds and the verdict."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-generate/1"
FORMAT: Final = JsonFormat(ID, "generate-1", indent=2)
