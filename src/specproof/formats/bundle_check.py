"""What ``specproof bundle check --json`` prints: does a Core ML bundle compute what its source model computes."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-bundle-check/1"
FORMAT: Final = JsonFormat(ID, "bundle-check-1", indent=2)
