"""The certify report: ``specproof certify --report`` and ``specproof fuzz --report`` write it."""

from __future__ import annotations

from typing import Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-report/2"
FORMAT: Final = JsonFormat(ID, "report-2", indent=2, default=str)
