"""JSON Schemas (draft 2020-12) of every JSON format specproof defines, except the wire protocol.

The schema files are package data under ``specproof/schemas/`` (one per format, named after
it: format ``<name>/<n>`` is ``<name>-<n>.json``); the wire protocol's messages have their
own in ``specproof/wire/schemas/``. Each format's module in ``specproof.formats`` names its
schema; this module only loads and applies schemas by name. Input formats (session histories,
traces, golden files, bench baselines) are validated with these schemas before any other
check; output formats (the certify report, the bench result) are validated against theirs
by the project's tests.

- ``load_schema(name)``: the schema as a dict (a fresh copy);
- ``problems(name, obj, part=None)``: every reason ``obj`` does not match, as ``SchemaProblem``
  records (the JSON path, the keyword, the value, a phrase), in a stable order;
- ``validate(name, obj, part=None)``: the same as one-line strings naming the path
  (``requests[0].prompt[1] = -1 must be >= 0``), ``[]`` when valid.

``part`` picks a definition of the schema's ``$defs`` (a JSON Lines format has one per
kind of line: ``validate("trace-1", line, part="round")``).

This module imports nothing from specproof.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Sequence
from importlib import resources
from typing import Any, Final

import attrs

__all__ = [
    "SchemaProblem",
    "describe_value",
    "expectation",
    "format_path",
    "load_schema",
    "problems",
    "schema_names",
    "validate",
]


def schema_names() -> list[str]:
    """Every schema shipped in ``specproof/schemas/`` (``report-2``, ``trace-1``, ...), sorted."""
    folder = resources.files("specproof").joinpath("schemas")
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of format ``name`` (a key of ``SCHEMAS``), a fresh copy."""
    return copy.deepcopy(_load(name))


@functools.cache
def _load(name: str) -> dict[str, Any]:
    if name not in schema_names():
        raise KeyError(f"no specproof schema {name!r} (known: {', '.join(schema_names())})")
    text = resources.files("specproof").joinpath("schemas", f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


@functools.cache
def _validator(name: str, part: str | None) -> Any:
    import jsonschema

    root = _load(name)
    jsonschema.Draft202012Validator.check_schema(root)
    if part is None:
        return jsonschema.Draft202012Validator(root)
    if part not in root.get("$defs", {}):
        raise KeyError(f"schema {name!r} has no part {part!r} (its $defs: {', '.join(root.get('$defs', {}))})")
    # the definition, resolved against the root so its own $refs to other definitions work
    schema: dict[str, Any] = {k: root[k] for k in ("$schema", "$id", "$defs") if k in root}
    schema["$ref"] = f"#/$defs/{part}"
    return jsonschema.Draft202012Validator(schema)


# --------------------------------------------------------------------------- problems


def format_path(path: Sequence[str | int]) -> str:
    """``("requests", 0, "prompt", 1)`` -> ``requests[0].prompt[1]`` (``""`` for the document itself)."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def describe_value(value: object, limit: int = 80) -> str:
    """A short JSON rendering of ``value`` (strings as Python reprs, as the messages quote them)."""
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_NOUNS: Final = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "a boolean",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


def expectation(schema: object, *, integer: str = "an integer") -> str:
    """What ``schema`` asks for, in words: ``an integer >= 0``, ``a list of integers``, ``one of 'a', 'b'``."""
    if not isinstance(schema, dict):
        return "anything"
    if "const" in schema:
        return describe_value(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(describe_value(v) for v in schema["enum"])
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    words = []
    for kind in kinds:
        if kind == "null":
            continue
        word = integer if kind == "integer" else _NOUNS.get(kind, kind)
        if kind in ("integer", "number") and "minimum" in schema and "exclusiveMaximum" in schema:
            word += f" in [{schema['minimum']}, {schema['exclusiveMaximum']})"
        elif kind in ("integer", "number"):
            if "minimum" in schema:
                word += f" >= {schema['minimum']}"
            if "exclusiveMinimum" in schema:
                word += f" > {schema['exclusiveMinimum']}"
            if "maximum" in schema:
                word += f" <= {schema['maximum']}"
            if "exclusiveMaximum" in schema:
                word += f" < {schema['exclusiveMaximum']}"
        if kind == "string" and schema.get("minLength"):
            word = "a non-empty string"
        if kind == "array":
            items = schema.get("items")
            if schema.get("minItems"):
                word = "a non-empty list"
            if isinstance(items, dict) and items.get("type") in ("integer", "number", "string"):
                plural = integer.split(" ", 1)[-1] if items["type"] == "integer" else items["type"]
                word += f" of {plural}s"
        words.append(word)
    if "null" in kinds:
        words.append("null")
    return " or ".join(words) if words else "a valid value"


@attrs.frozen
class SchemaProblem:
    """One way a document fails its schema.

    ``path`` is where: the offending value's JSON path, or for ``required`` and
    ``additionalProperties`` the missing or unknown field's own path; ``keyword`` the
    failing JSON Schema keyword (``type``, ``required``, ``minimum``, ...); ``value`` the
    offending value (None for a missing field); ``schema`` the (sub)schema holding the
    keyword; ``text`` a phrase to follow the path (``= -1 must be >= 0``).
    """

    path: tuple[str | int, ...]
    keyword: str
    value: object
    schema: Any
    text: str

    @property
    def where(self) -> str:
        return format_path(self.path)

    @property
    def field(self) -> str | int | None:
        """The last name of the path (the field itself), None at the document."""
        return self.path[-1] if self.path else None

    def __str__(self) -> str:
        return f"{self.where} {self.text}" if self.path else f"the document {self.text}"


def _phrase(keyword: str, value: object, schema: dict[str, Any], message: str) -> str:
    arg: Any = schema.get(keyword)
    if keyword == "type":
        return f"must be {expectation(schema)}, got {describe_value(value)}"
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[keyword]
        return f"= {describe_value(value)} must be {op} {arg}"
    if keyword == "enum":
        return f"= {describe_value(value)} is not one of {', '.join(describe_value(v) for v in arg)}"
    if keyword == "const":
        return f"= {describe_value(value)}; expected {describe_value(arg)}"
    if keyword == "minItems":
        if arg == 1:
            return "must be a non-empty list"
        return f"must have at least {arg} items, got {len(value) if isinstance(value, list) else value}"
    if keyword == "maxItems":
        return f"must have at most {arg} items, got {len(value) if isinstance(value, list) else value}"
    if keyword == "minLength":
        return "must be a non-empty string" if arg == 1 else f"must have at least {arg} characters"
    if keyword == "minProperties":
        return "must be a non-empty object" if arg == 1 else f"must have at least {arg} fields"
    if keyword == "pattern":
        return f"= {describe_value(value)} does not match the pattern {arg!r}"
    return message


def _known(schema: dict[str, Any]) -> str:
    return ", ".join(sorted(schema.get("properties", {})))


def _expand(error: Any) -> list[SchemaProblem]:
    path = tuple(error.absolute_path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "required":
        present = error.instance if isinstance(error.instance, dict) else {}
        return [
            SchemaProblem((*path, name), "required", None, schema, "is missing")
            for name in error.validator_value
            if name not in present
        ]
    if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(error.instance, dict):
        allowed = set(schema.get("properties", {}))
        extra = [k for k in error.instance if k not in allowed]
        if extra and error.validator_value is False:
            return [
                SchemaProblem(
                    (*path, name),
                    error.validator,
                    error.instance[name],
                    schema,
                    f"is not a known field (known: {_known(schema)})",
                )
                for name in extra
            ]
    if error.validator in ("anyOf", "oneOf") and error.context:
        # the alternative that got furthest speaks for the group
        best = max(error.context, key=lambda e: (len(e.absolute_path), -len(list(e.schema_path))))
        return _expand(best)
    return [
        SchemaProblem(
            path,
            str(error.validator),
            error.instance,
            schema,
            _phrase(str(error.validator), error.instance, schema, error.message),
        )
    ]


def problems(name: str, obj: object, *, part: str | None = None) -> list[SchemaProblem]:
    """Every reason ``obj`` does not match schema ``name`` (or its ``$defs`` entry ``part``); ``[]`` if valid.

    Ordered: a wrong ``format``/``schema`` field first (every other problem may follow from
    it), then in the order the schema lists its keywords and fields.
    """
    out: list[SchemaProblem] = []
    for error in _validator(name, part).iter_errors(obj):
        out.extend(_expand(error))
    return sorted(out, key=lambda p: p.path[:1] not in (("format",), ("schema",)))


def validate(name: str, obj: object, *, part: str | None = None) -> list[str]:
    """``problems`` as one-line strings naming the JSON path; ``[]`` when ``obj`` is valid."""
    return [str(p) for p in problems(name, obj, part=part)]
