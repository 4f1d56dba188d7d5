"""A request's ``Grammar`` as llama.cpp's grammar sampler takes it (GBNF), or ``UnsupportedParameterError``
naming what has no faithful translation (docs/real-engines.md, "Grammars on llama.cpp").

The contract's grammars are llguidance's (``Grammar.llguidance``); llama.cpp takes GBNF. Each kind is
translated where the translation keeps the language, and refused by name where it would not:

- ``json_schema``: llama-cpp-python's port of llama.cpp's converter (``json_schema_to_gbnf``) on the schema
  keywords it models as llguidance does: ``type`` object / array / boolean / null, ``properties`` with every
  property ``required`` and ``additionalProperties: false``, ``items``, ``minItems`` / ``maxItems``, ``enum``,
  ``const``, and an integer with both ``minimum`` and ``maximum`` (as the ``enum`` of its values: the port
  ignores the bounds). Only the compact form (``"x-guidance": {"whitespace_flexible": false}``): the port
  allows one space where llguidance's compact JSON allows none, so its ``space`` rule is emptied;
- ``regex``: Python's own parse of the pattern (``re._parser``) rewritten as GBNF, literals, classes,
  ``.``, groups, alternation and bounded or unbounded repeats; anchors, look-arounds, back-references,
  flags and class shorthands (``\\d``, ``\\w``, ``\\s``: Unicode-dependent) are refused;
- ``lark``: a subset written as GBNF rule for rule: ``name: alternatives`` with quoted strings,
  ``/regex/`` terminals (as above), rule names, parentheses and ``?`` / ``*`` / ``+``; directives
  (``%ignore``, ``%import``), ``[...]``, templates, priorities and flags are refused. GBNF is matched on
  characters where llguidance lexes Lark's terminals: equal languages where the terminals' lexing is
  unambiguous (as for the grammar check's CFG), which the certification judges.

A reasoning delimiter (``reasoning_end``) becomes a lazy grammar: llama.cpp leaves the output free until
the trigger pattern (the delimiter's bytes) first matches, then feeds the delimiter to the grammar, whose
root here is the delimiter followed by the translated grammar. The delimiter must be printable ASCII.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from specproof.contract import Grammar, token_bytes
from specproof.contract.errors import UnsupportedParameterError

__all__ = [
    "LlamaCppGrammar", "check_grammar_eos", "gbnf_literal", "grammar_stage", "regex_to_gbnf", "translate_grammar",
]  # fmt: skip

_re_parser: Any = getattr(re, "_parser")  # noqa: B009  (Python's own regex parser; sre_parse is deprecated)
_c: Any = getattr(re, "_constants")  # noqa: B009

#: the entry rule when a reasoning delimiter comes first
REASONING_ROOT = "specproof-reasoning-root"


@attrs.frozen(kw_only=True)
class LlamaCppGrammar:
    """What ``llama_sampler_init_grammar`` (or ``_lazy_patterns`` with ``triggers``) takes."""

    gbnf: str
    root: str = "root"
    triggers: tuple[str, ...] = ()  # std::regex patterns; empty: constrained from the first token


def translate_grammar(grammar: Grammar, vocab_size: int) -> LlamaCppGrammar:
    """``grammar`` as GBNF for a vocabulary of ``vocab_size`` byte tokens, or ``UnsupportedParameterError``."""
    translate: dict[str, Callable[[str], str]] = {
        "json_schema": _json_schema_gbnf, "regex": lambda s: f"root ::= {regex_to_gbnf(s)}\n", "lark": _lark_gbnf,
    }  # fmt: skip
    gbnf = translate[grammar.kind](grammar.source).rstrip("\n") + "\n"
    if not grammar.reasoning_end:
        return LlamaCppGrammar(gbnf=gbnf)
    text = token_bytes(vocab_size)
    pieces = [text[t] if t < len(text) else None for t in grammar.reasoning_end]
    delimiter = b"".join(p or b"" for p in pieces)
    if any(p is None for p in pieces) or not all(0x20 <= b < 0x7F for b in delimiter):
        raise UnsupportedParameterError(
            f"llamacpp: grammar reasoning_end {list(grammar.reasoning_end)}: llama.cpp's lazy grammar matches its "
            "trigger on the text and feeds it to the grammar as characters, so the delimiter must be printable "
            f"ASCII; these ids stand for {pieces}"
        )
    literal = gbnf_literal(delimiter.decode("ascii"))
    pattern = "[\\s\\S]*?(" + "".join(f"\\x{b:02x}" for b in delimiter) + ")"
    return LlamaCppGrammar(
        gbnf=f"{gbnf}{REASONING_ROOT} ::= {literal} root\n", root=REASONING_ROOT, triggers=(pattern,)
    )


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (every character outside printable ASCII escaped by code point)."""
    return '"' + "".join(_gbnf_char(ord(c), quote='"') for c in text) + '"'


def _gbnf_char(code: int, *, quote: str) -> str:
    if 0x20 <= code < 0x7F and chr(code) not in (quote, "\\", "]", "[", "^", "-"):
        return chr(code)
    if code < 0x100:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _refuse(kind: str, what: str) -> UnsupportedParameterError:
    return UnsupportedParameterError(f"llamacpp: grammar ({kind}): {what} has no faithful GBNF translation here")


# ---------------------------------------------------------------------------------------------------- regex


def regex_to_gbnf(pattern: str) -> str:
    """A GBNF expression of the strings ``pattern`` matches whole (Python's regex syntax)."""
    try:
        parsed = _re_parser.parse(pattern)
    except re.error as exc:
        raise UnsupportedParameterError(f"llamacpp: grammar (regex) {pattern!r} does not parse: {exc}") from None
    if parsed.state.flags & ~(re.UNICODE | getattr(re, "TEMPLATE", 0)):
        raise _refuse("regex", f"the inline flags of {pattern!r}")
    return _sequence(list(parsed))


def _sequence(items: Sequence[tuple[Any, Any]]) -> str:
    parts = [_node(op, av) for op, av in items]
    return " ".join(parts) if parts else '""'


def _node(op: Any, av: Any) -> str:
    if op is _c.LITERAL:
        return '"' + _gbnf_char(av, quote='"') + '"'
    if op is _c.NOT_LITERAL:
        return "[^" + _gbnf_char(av, quote="]") + "]"
    if op is _c.ANY:
        return "[^\\x0A]"
    if op is _c.IN:
        return _char_class(av)
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):  # a lazy repeat matches the same strings
        low, high, sub = av
        bound = f"{{{low},}}" if high == _c.MAXREPEAT else f"{{{low},{high}}}"
        return f"({_sequence(list(sub))}){bound}"
    if op is _c.SUBPATTERN:
        _group, add_flags, del_flags, sub = av
        if add_flags or del_flags:
            raise _refuse("regex", "a group with flags")
        return f"({_sequence(list(sub))})"
    if op is _c.BRANCH:
        return "(" + " | ".join(_sequence(list(alt)) for alt in av[1]) + ")"
    raise _refuse("regex", f"the construct {str(op).lower()} (anchors, look-arounds, back-references)")


def _char_class(items: Sequence[tuple[Any, Any]]) -> str:
    out, negate = [], False
    for op, av in items:
        if op is _c.NEGATE:
            negate = True
        elif op is _c.LITERAL:
            out.append(_gbnf_char(av, quote="]"))
        elif op is _c.RANGE:
            out.append(f"{_gbnf_char(av[0], quote=']')}-{_gbnf_char(av[1], quote=']')}")
        else:
            raise _refuse("regex", f"the class item {str(op).lower()} {av} (\\d, \\w, \\s depend on Unicode tables)")
    return "[" + ("^" if negate else "") + "".join(out) + "]"


# ---------------------------------------------------------------------------------------------------- JSON schema

_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                       "enum", "const", "minimum", "maximum", "x-guidance"})  # fmt: skip
_TYPES = frozenset({"object", "array", "boolean", "null", "integer"})
_ENUM_LIMIT = 1000  # an integer range becomes the enum of its values: at most this many


def _json_schema_gbnf(source: str) -> str:
    schema = json.loads(source)
    options = schema.get("x-guidance") if isinstance(schema, dict) else None
    if options != {"whitespace_flexible": False}:
        raise _refuse(
            "json_schema",
            f'x-guidance {options!r} (llguidance\'s flexible whitespace; give "x-guidance": '
            '{"whitespace_flexible": false})',
        )
    faithful = _faithful(schema, top=True)  # refusals first: they need no llama-cpp-python
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # the engine's own converter (llama-cpp-python)

    gbnf = json_schema_to_gbnf(json.dumps(faithful))
    # llama.cpp's converter lets one space follow every value and separator; llguidance's compact JSON none
    return re.sub(r"(?m)^space ::= .*$", 'space ::= ""', gbnf)


def _faithful(schema: object, *, top: bool = False) -> object:
    """``schema`` without ``x-guidance``, an integer range as its enum; refused where the converter differs."""
    if not isinstance(schema, dict):
        raise _refuse("json_schema", f"the subschema {schema!r}")
    unknown = sorted(set(schema) - _KEYWORDS - ({"x-guidance"} if top else set()))
    if unknown or (not top and "x-guidance" in schema):
        raise _refuse("json_schema", f"the keyword {(unknown or ['x-guidance'])[0]!r}")
    kind = schema.get("type")
    if kind is not None and kind not in _TYPES:
        raise _refuse("json_schema", f"type {kind!r} (string and number escapes and forms are not verified)")
    out = {k: v for k, v in schema.items() if k != "x-guidance"}
    if kind == "integer" or "minimum" in out or "maximum" in out:
        low, high = out.get("minimum"), out.get("maximum")
        if kind != "integer" or not isinstance(low, int) or not isinstance(high, int) or high - low >= _ENUM_LIMIT:
            raise _refuse("json_schema", f"an integer without both bounds within {_ENUM_LIMIT} values ({schema!r})")
        return {"enum": list(range(low, high + 1))}
    if kind == "object":
        props = out.get("properties", {})
        if out.get("additionalProperties") is not False or sorted(out.get("required", [])) != sorted(props):
            raise _refuse("json_schema", "an object without additionalProperties false and every property required")
        out["properties"] = {name: _faithful(sub) for name, sub in props.items()}
    if "items" in out:
        out["items"] = _faithful(out["items"])
    return out


# ---------------------------------------------------------------------------------------------------- Lark

_LARK_TOKEN = re.compile(
    r"(?P<ws>[ \t]+|//[^\n]*)|(?P<nl>\n)|(?P<name>\??[A-Za-z_][A-Za-z_0-9]*)(?P<colon>[ \t]*:)?"
    r'|(?P<string>"(?:[^"\\\n]|\\.)*")|(?P<regex>/(?:[^/\\\n]|\\.)+/)|(?P<op>[|()?*+])'
)


def _lark_gbnf(source: str) -> str:
    rules: dict[str, list[str]] = {}
    current: list[str] | None = None
    at = 0
    while at < len(source):
        m = _LARK_TOKEN.match(source, at)
        if m is None:
            raise _refuse("lark", f"the text {source[at : at + 12]!r} (directives, [...], templates, flags)")
        at = m.end()
        if m["name"] and m["colon"]:
            name = _lark_name(m["name"].lstrip("?"))
            current = rules.setdefault(name, [])
        elif m["ws"] or m["nl"]:
            continue
        elif current is None:
            raise _refuse("lark", f"{m[0]!r} before any rule")
        elif m["name"]:
            current.append(_lark_name(m["name"]))
        elif m["string"]:
            current.append(gbnf_literal(ast.literal_eval(m["string"])))
        elif m["regex"]:
            current.append("(" + regex_to_gbnf(m["regex"][1:-1].replace("\\/", "/")) + ")")
        else:
            current.append(m["op"])
    if "l-start" not in rules:
        raise _refuse("lark", "a grammar without a start rule")
    lines = ["root ::= l-start", *(f"{name} ::= {' '.join(body)}" for name, body in rules.items())]
    return "\n".join(lines) + "\n"


def _lark_name(name: str) -> str:
    return "l-" + name.lower().replace("_", "-") + ("-t" if name.isupper() else "")


# ---------------------------------------------------------------------------------------------------- the sampler


def check_grammar_eos(eos_ids: frozenset[int], eog_ids: frozenset[int]) -> None:
    """A grammar request must end on llama.cpp's end-of-generation ids exactly: its grammar sampler lets a
    complete grammar end on those (``llama_vocab_is_eog``) and on nothing else."""
    if eos_ids != eog_ids:
        raise UnsupportedParameterError(
            f"llamacpp: grammar with EOS ids {sorted(eos_ids)}: llama.cpp's grammar sampler ends a complete grammar "
            f"only on the model's end-of-generation ids {sorted(eog_ids)}; give the engine eos={min(eos_ids)} "
            "(llamacpp:FILE,eos=ID overrides the GGUF's tokenizer.ggml.eos_token_id) or ask with those ids"
        )


def grammar_stage(low: Any, vocab: Any, grammar: LlamaCppGrammar) -> Callable[[Any], None]:
    """llama.cpp's grammar sampler for ``grammar`` (``low``: ``llama_cpp.llama_cpp``; ``vocab``: the model's),
    as a stage that adds it to a ``LlamaSampler`` chain (which then owns it); ``UnsupportedParameterError``
    when llama.cpp's GBNF parser refuses the translation (checked here, before decoding)."""
    import ctypes

    text, root = grammar.gbnf.encode("utf-8"), grammar.root.encode("ascii")
    if grammar.triggers:
        patterns = (ctypes.c_char_p * len(grammar.triggers))(*(p.encode("ascii") for p in grammar.triggers))
        no_tokens = (low.llama_token * 1)()
        sampler = low.llama_sampler_init_grammar_lazy_patterns(
            vocab, text, root, patterns, len(grammar.triggers), no_tokens, 0
        )
    else:
        sampler = low.llama_sampler_init_grammar(vocab, text, root)
    if not sampler:
        raise UnsupportedParameterError(f"llamacpp: llama.cpp's GBNF parser refused the translated grammar: {text!r}")

    def add(chain: Any) -> None:
        low.llama_sampler_chain_add(chain.sampler, sampler)

    return add
