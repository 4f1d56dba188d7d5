"""A golden file: plain greedy's tokens of one target for fixed prompts (``check-trace --greedy``
reads it; ``traces.write_golden`` and ``specproof bundle export --golden`` write it)."""

from __future__ import annotations

import json
from typing import Any, Final

from specproof.formats import trace
from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "FORMAT_ONE_CASE_PER_LINE", "ID"]

ID: Final = "specproof-golden/1"
FORMAT: Final = JsonFormat(ID, "golden-1", max_bytes=trace.MAX_BYTES, indent=1)


def _one_case_per_line(doc: dict[str, Any]) -> str:
    """The golden file with one case per line (what ``bundle export --golden`` writes)."""
    head = json.dumps({"format": doc["format"], "target": doc["target"]})[:-1]
    body = ",\n  ".join(json.dumps(case) for case in doc["cases"])
    return f'{head}, "cases": [\n  {body}\n]}}\n'


#: the same format, one case per line (what ``bundle export --golden`` writes)
FORMAT_ONE_CASE_PER_LINE: Final = JsonFormat(ID, "golden-1", max_bytes=trace.MAX_BYTES, layout=_one_case_per_line)
