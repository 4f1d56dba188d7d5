"""What ``specproof invariants --json`` prints: the registry, a bare JSON array (no format field;
its schema is its version)."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-invariants/1"
FORMAT: Final = JsonFormat(ID, "invariants-1", field=None, indent=2)
