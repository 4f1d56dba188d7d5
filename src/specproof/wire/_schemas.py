"""The ``specproof-engine/1`` JSON Schemas (package data) and validation with ``jsonschema``."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any, Final

from specproof.wire._errors import EngineProtocolError

__all__ = [
    "CLIENT_MESSAGES",
    "ENGINE_MESSAGES",
    "PROTOCOL",
    "field_tables",
    "load_schema",
    "message_errors",
    "validate_message",
]

PROTOCOL: Final = "specproof-engine/1"
# What the engine sends, and what the client (the suite) sends.
ENGINE_MESSAGES: Final[tuple[str, ...]] = ("hello", "propose", "round", "state", "final", "ok", "error", "stepped")
CLIENT_MESSAGES: Final[tuple[str, ...]] = (
    "generate",
    "greedy",
    "reset",
    "shutdown",
    "draft",
    "add_request",
    "step",
    "abort",
    "preempt",
)


def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of message type ``name`` (a fresh copy)."""
    if name not in ENGINE_MESSAGES + CLIENT_MESSAGES:
        raise KeyError(f"no specproof-engine/1 message type {name!r}")
    text = resources.files("specproof.wire").joinpath("schemas", f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=1)
def _validators() -> dict[str, Any]:
    try:
        import jsonschema
    except ImportError as exc:  # pragma: no cover - a core dependency of the wire package
        raise EngineProtocolError("specproof.wire needs the jsonschema package: pip install jsonschema") from exc
    out: dict[str, Any] = {}
    for name in ENGINE_MESSAGES + CLIENT_MESSAGES:
        schema = load_schema(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        out[name] = jsonschema.Draft202012Validator(schema)
    return out


def message_errors(message: object) -> list[str]:
    """Every reason ``message`` is not a valid specproof-engine/1 message ([] when it is)."""
    if not isinstance(message, dict):
        return [f"a message must be a JSON object, got {type(message).__name__}"]
    kind = message.get("type")
    validators = _validators()
    if not isinstance(kind, str) or kind not in validators:
        known = ", ".join(ENGINE_MESSAGES + CLIENT_MESSAGES)
        return [f"'type' is {kind!r}, not a message type of {PROTOCOL} ({known})"]
    errors = sorted(validators[kind].iter_errors(message), key=lambda e: list(e.absolute_path))
    return [f"{kind}{''.join(f'[{p!r}]' for p in e.absolute_path)}: {e.message}" for e in errors]


def validate_message(message: object, *, expect: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Return ``message`` when it is valid (and of a type in ``expect``); raise ``EngineProtocolError``."""
    problems = message_errors(message)
    if problems:
        raise EngineProtocolError("schema violation: " + "; ".join(problems[:5]))
    assert isinstance(message, dict)
    if expect is not None and message["type"] not in expect:
        raise EngineProtocolError(f"unexpected message type {message['type']!r} (expected {' or '.join(expect)})")
    return message


# --------------------------------------------------------------------------- the field tables in docs/protocol.md


def _type(schema: dict[str, Any]) -> str:
    """A JSON Schema fragment as a short type: ``integer >= 0``, ``array of integer >= 0 (>= 1 items)``..."""
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "oneOf" in schema:
        return " or ".join(_type(s) for s in schema["oneOf"])
    kind = schema.get("type")
    if kind == "integer":
        return "integer" + (f" >= {schema['minimum']}" if "minimum" in schema else "")
    if kind == "number":
        low = f" >= {schema['minimum']}" if "minimum" in schema else ""
        return "number" + (f" > {schema['exclusiveMinimum']}" if "exclusiveMinimum" in schema else low)
    if kind == "string":
        text = "string" + (" (non-empty)" if schema.get("minLength") else "")
        return text + (f", {schema['contentEncoding']}" if "contentEncoding" in schema else "")
    if kind == "array" and "prefixItems" in schema:  # a tuple: one type per position
        return "[" + ", ".join(_type(s) for s in schema["prefixItems"]) + "]"
    if kind == "array":
        items = _type(schema.get("items", {}))
        text = f"array of {items}"
        if schema.get("minItems"):
            text += f" (>= {schema['minItems']} items)"
        if schema.get("uniqueItems"):
            text += " (unique)"
        return text
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and not schema.get("properties"):
            inner = "object (below)" if extra.get("type", "object") == "object" else _type(extra)
            return f"object: name → {inner}"
        return "object (below)" if schema.get("properties") else "object"
    return kind if isinstance(kind, str) else "any JSON value"


def _rows(prefix: str, schema: dict[str, Any], required: set[str]) -> list[str]:
    rows = []
    for name, sub in schema.get("properties", {}).items():
        field = f"{prefix}{name}"
        need = "required" if name in required else "optional"
        text = sub.get("description", "") or ("the message type" if field == "type" else "")
        if not text and "oneOf" in sub:
            text = "; ".join(s["description"] for s in sub["oneOf"] if "description" in s)
        rows.append(f"| `{field}` | {_type(sub)} | {need} | {text} |")
        # an object inside a list or beside null (a batch's per-request outputs) has its fields listed too
        items = sub.get("items", {}) if sub.get("type") == "array" else {}
        for inner, below in ((items, f"{field}[]."), *((s, f"{field}.") for s in sub.get("oneOf", ()))):
            if isinstance(inner, dict) and inner.get("type") == "object" and inner.get("properties"):
                rows += _rows(below, inner, set(inner.get("required", ())))
        if sub.get("type") == "object":
            if sub.get("properties"):
                rows += _rows(f"{field}.", sub, set(sub.get("required", ())))
            extra = sub.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("properties"):
                rows += _rows(f"{field}.NAME.", extra, set(extra.get("required", ())))
    return rows


def field_tables() -> str:
    """Every message's fields and types as Markdown, generated from the shipped schemas (the block in
    docs/protocol.md between the ``fields:start``/``fields:end`` markers; a test keeps them equal)."""
    out: list[str] = []
    for name in ENGINE_MESSAGES + CLIENT_MESSAGES:
        schema = load_schema(name)
        side = "engine → client" if name in ENGINE_MESSAGES else "client → engine"
        closed = "" if schema.get("additionalProperties", True) else " Closed: no other field is allowed."
        out += [
            f"#### `{name}` ({side}) — [schema](../src/specproof/wire/schemas/{name}.json)",
            "",
            f"{schema.get('title', '')}.{closed}",
            "",
            "| field | type | | meaning |",
            "|---|---|---|---|",
            *_rows("", schema, set(schema.get("required", ()))),
            "",
        ]
    return "\n".join(out).rstrip() + "\n"
