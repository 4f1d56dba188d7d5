"""A bench result: ``specproof bench --json`` writes it (``bench.run_bench``'s dict)."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-bench/2"
FORMAT: Final = JsonFormat(ID, "bench-2", field="schema", indent=2)
