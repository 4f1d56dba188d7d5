"""A session history (the requests a failing ``engine.session`` check sent): written on failure,
read back by ``--replay-session``. One request per line, so a history reads like a log."""

from __future__ import annotations

import json
from typing import Any, Final

from specproof.formats._format import JsonFormat

__all__ = ["FORMAT", "ID"]

ID: Final = "specproof-session/1"
SCHEMA_FILE: Final = "specproof/schemas/session-1.json"  # for messages: the schema every history is validated with


def _layout(doc: dict[str, Any]) -> str:
    """The history with its ``requests`` last, one request per line."""
    data = {k: v for k, v in doc.items() if k != "requests"}
    head = json.dumps(data, indent=1)[:-2]  # the object without its closing brace
    body = ",\n".join("  " + json.dumps(r, separators=(", ", ": ")) for r in doc["requests"])
    return f'{head},\n "requests": [\n{body}\n ]\n}}\n'


FORMAT: Final = JsonFormat(ID, "session-1", layout=_layout)
