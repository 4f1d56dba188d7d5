"""What ``specproof bundle inspect --json`` prints: can a Core ML bundle verify K drafts in one forward."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-bundle-inspect/1"
FORMAT: Final = JsonFormat(ID, "bundle-inspect-1", indent=2)
