"""``Grammar``: the structured-output constraint a request may carry in ``DecodeParams`` (docs/contract.md,
"Decode state"), validated here and nowhere else.

A JSON schema, a regular expression or a Lark context-free grammar, compiled by llguidance; with
``reasoning_end`` (a delimiter token sequence such as the ids of ``</think>``), the output is free text
until that delimiter first ends, and constrained from the token after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from numbers import Integral
from typing import Literal

import attrs

from specproof.contract.errors import InvalidSettingError

__all__ = ["GRAMMAR_KINDS", "Grammar"]

GrammarKind = Literal["json_schema", "regex", "lark"]
GRAMMAR_KINDS: tuple[str, ...] = ("json_schema", "regex", "lark")


def _kind(value: object) -> str:
    if value not in GRAMMAR_KINDS:
        raise InvalidSettingError(f"decode grammar kind={value!r} is not one of {GRAMMAR_KINDS}")
    return str(value)


def _delimiter(value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidSettingError(f"decode grammar reasoning_end={value!r} must be a sequence of token ids")
    out = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, Integral) or int(t) < 0:
            raise InvalidSettingError(f"decode grammar reasoning_end holds {t!r}, which is not a token id")
        out.append(int(t))
    return tuple(out)


@attrs.frozen(kw_only=True)
class Grammar:
    """``kind`` and ``source``: the schema (a mapping or its JSON text), the regex or the Lark grammar;
    ``reasoning_end``: the delimiter's token ids (empty: constrained from the first output token)."""

    kind: str = attrs.field(converter=_kind)
    source: str = attrs.field()
    reasoning_end: tuple[int, ...] = attrs.field(default=(), converter=_delimiter)

    def __attrs_post_init__(self) -> None:
        import llguidance  # here, not at import: a run that draws no grammar never loads it

        error = llguidance.LLMatcher.validate_grammar(self.llguidance())
        if error:
            raise InvalidSettingError(f"decode grammar ({self.kind}) does not compile: {error.strip()}")

    @source.validator
    def _check_source(self, _attr: attrs.Attribute[str], value: object) -> None:
        import jsonschema  # here, not at import (as llguidance)

        if not isinstance(value, str) or not value.strip():
            raise InvalidSettingError(f"decode grammar source={value!r} must be a non-empty string")
        if self.kind == "json_schema":
            try:
                schema = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InvalidSettingError(f"decode grammar json_schema is not JSON: {exc}") from None
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise InvalidSettingError(f"decode grammar json_schema is not a JSON schema: {exc.message}") from None

    @classmethod
    def json_schema(cls, schema: Mapping[str, object] | str, *, reasoning_end: Iterable[int] = ()) -> Grammar:
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        return cls(kind="json_schema", source=text, reasoning_end=reasoning_end)

    def llguidance(self) -> str:
        """The grammar as llguidance takes it (``LLMatcher(tokenizer, grammar)``)."""
        import llguidance

        if self.kind == "json_schema":
            return str(llguidance.LLMatcher.grammar_from_json_schema(self.source))
        if self.kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(self.source))
        return str(llguidance.LLMatcher.grammar_from_lark(self.source))

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "source": self.source, "reasoning_end": list(self.reasoning_end)}

    @classmethod
    def from_json(cls, data: object) -> Grammar:
        if isinstance(data, Grammar):
            return data
        if not isinstance(data, Mapping):
            raise InvalidSettingError(f"decode grammar={data!r} must be an object with kind and source")
        unknown = sorted(set(data) - {"kind", "source", "reasoning_end"})
        if unknown or "kind" not in data or "source" not in data:
            what = f"unknown field {unknown[0]!r}" if unknown else "kind and source are required"
            raise InvalidSettingError(f"decode grammar: {what} (fields: kind, source, reasoning_end)")
        source = data["source"]
        if data["kind"] == "json_schema" and isinstance(source, Mapping):
            source = json.dumps(source, sort_keys=True)
        return cls(kind=data["kind"], source=source, reasoning_end=data.get("reasoning_end", ()))  # type: ignore[arg-type]
