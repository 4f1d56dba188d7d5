"""A bench baseline: the speed gate's reference (``bench --save-baseline`` writes it,
``bench --gate`` reads it)."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-bench-baseline/2"
FORMAT: Final = JsonFormat(ID, "bench-baseline-2", field="schema", indent=2, sort_keys=True)
