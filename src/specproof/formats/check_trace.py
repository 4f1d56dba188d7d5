"""What ``specproof check-trace --json`` prints: the trace's verdict per invariant."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-check-trace/1"
FORMAT: Final = JsonFormat(ID, "check-trace-1", indent=2)
