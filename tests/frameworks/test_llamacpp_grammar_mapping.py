"""The ``llamacpp:`` engine's grammar mapping without llama.cpp: each grammar kind as GBNF, the refusals that
name what has no faithful translation, the ``eos=`` option, and a refusal met by ``decode.grammar`` as a skip
(docs/real-engines.md, "Grammars on llama.cpp").

tests/frameworks/test_llamacpp_grammar.py runs the translations on a real llama.cpp (its masks equal
llguidance's) and certifies them; the JSON-schema translation needs llama-cpp-python's converter and is tested
there and here only where llama-cpp-python is importable.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from specproof.conformance.checks.decode_grammar import GrammarRun, check_grammar, grammars
from specproof.contract import DecodeParams, Generation, Grammar
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.engine.adapters._llamacpp_grammar import (
    REASONING_ROOT,
    check_grammar_eos,
    regex_to_gbnf,
    translate_grammar,
)
from specproof.engine.adapters.llamacpp import parse_llamacpp_spec

JSON_OBJECT, JSON_ARRAY, REGEX, LARK = grammars()


def test_the_checks_regex_is_the_same_expression_in_gbnf() -> None:
    assert translate_grammar(REGEX, 256).gbnf == 'root ::= ([0-9]){1,3} (("," ([0-9]){1,3})){0,2}\n'


@pytest.mark.parametrize(
    ("pattern", "gbnf"),
    [
        ("ab|c", '("a" "b" | "c")'),
        ("a*?b+", '("a"){0,} ("b"){1,}'),  # a lazy repeat matches the same strings
        ("[^a-c\\]]", "[^a-c\\x5D]"),
        (".", "[^\\x0A]"),
        ("(?:x)?", '("x"){0,1}'),
        ('"\\-', '"\\x22" "\\x2D"'),
        ("é", '"\\xE9"'),
        ("", '""'),
    ],
)
def test_regex_constructs_map_onto_gbnf(pattern: str, gbnf: str) -> None:
    assert regex_to_gbnf(pattern) == gbnf


@pytest.mark.parametrize(
    ("pattern", "message"),
    [("^a", "construct at"), ("(a)\\1", "back-references"), ("a(?=b)", "look-arounds"), ("(?i)a", "inline flags"),
     ("(?i:a)", "group with flags"), ("[\\w]", "Unicode tables"), ("(", "does not parse")],
)  # fmt: skip
def test_regex_constructs_without_a_gbnf_form_are_refused(pattern: str, message: str) -> None:
    with pytest.raises(UnsupportedParameterError, match=message):
        regex_to_gbnf(pattern)


def test_the_checks_lark_grammar_is_written_rule_for_rule() -> None:
    assert translate_grammar(LARK, 256).gbnf == (
        "root ::= l-start\n"
        'l-start ::= l-term ( ( "+" | "\\x2D" ) l-term ) ?\n'
        'l-term ::= (([0-9]){1,2}) | "(" (([0-9]){1,2}) ")"\n'
    )


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        (Grammar(kind="regex", source="\\d+"), "Unicode tables"),
        (Grammar(kind="lark", source='start: "a"\n%ignore " "\n'), "'%ignore"),
        (Grammar(kind="lark", source='start: ["a"] "b"\n'), "directives, \\[...\\]"),
        (Grammar.json_schema({"type": "integer"}), "x-guidance None"),
        (Grammar.json_schema({"type": "string", "x-guidance": {"whitespace_flexible": False}}), "type 'string'"),
        (
            Grammar.json_schema({"type": "integer", "minimum": 0, "x-guidance": {"whitespace_flexible": False}}),
            "both bounds",
        ),
        (
            Grammar.json_schema(
                {
                    "type": "object",
                    "properties": {"a": {"type": "boolean"}},
                    "x-guidance": {"whitespace_flexible": False},
                }
            ),
            "every property required",
        ),
        (
            Grammar.json_schema(
                {
                    "type": "array",
                    "items": {"type": "boolean"},
                    "minItems": 1,
                    "pattern": "x",
                    "x-guidance": {"whitespace_flexible": False},
                }
            ),
            "keyword 'pattern'",
        ),
    ],
)
def test_what_has_no_faithful_translation_is_refused_by_name(grammar: Grammar, message: str) -> None:
    with pytest.raises(UnsupportedParameterError, match=message):
        translate_grammar(grammar, 256)


def test_a_reasoning_delimiter_is_a_lazy_grammar_whose_root_starts_with_it() -> None:
    grammar = translate_grammar(attrs.evolve(REGEX, reasoning_end=tuple(b"</t>")), 256)
    assert grammar.root == REASONING_ROOT
    assert grammar.gbnf.endswith(f'{REASONING_ROOT} ::= "</t>" root\n')
    assert grammar.triggers == ("[\\s\\S]*?(\\x3c\\x2f\\x74\\x3e)",)


@pytest.mark.parametrize("delimiter", [(0,), (10,), (200,)])
def test_a_delimiter_that_is_not_printable_ascii_is_refused(delimiter: tuple[int, ...]) -> None:
    with pytest.raises(UnsupportedParameterError, match="printable ASCII"):
        translate_grammar(attrs.evolve(REGEX, reasoning_end=delimiter), 256)


def test_a_grammar_must_end_on_llama_cpps_end_of_generation_id() -> None:
    check_grammar_eos(frozenset({0}), frozenset({0}))
    with pytest.raises(UnsupportedParameterError, match=r"only on the model's end-of-generation ids \[2\]; give the "
                       r"engine eos=0"):  # fmt: skip
        check_grammar_eos(frozenset({0}), frozenset({2}))


def test_the_checks_json_schemas_are_the_converters_output_without_whitespace() -> None:
    pytest.importorskip("llama_cpp.llama_grammar", reason="the JSON-schema converter is llama-cpp-python's")
    array = translate_grammar(JSON_ARRAY, 256).gbnf
    assert 'root ::= "[" space (boolean ("," space boolean)?)? "]" space' in array
    assert 'space ::= ""' in array
    assert '"99"' in translate_grammar(JSON_OBJECT, 256).gbnf  # the integer range, as its values


def test_the_eos_option_is_parsed_and_named(tmp_path: Path) -> None:
    settings = parse_llamacpp_spec(f"{tmp_path}/m.gguf,eos=0")
    assert settings.eos == 0
    assert settings.short_name() == "llamacpp-greedy-eos0"
    assert ",eos=0" in settings.describe()
    assert parse_llamacpp_spec(f"{tmp_path}/m.gguf").eos is None


@pytest.mark.parametrize("value", ["-1", "x", ""])
def test_a_bad_eos_option_is_a_one_line_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(InvalidSettingError, match="eos="):
        parse_llamacpp_spec(f"{tmp_path}/m.gguf,eos={value}")


def test_an_eos_past_the_vocabulary_is_refused_before_llama_cpp_loads(tmp_path: Path) -> None:
    from specproof.engine.adapters.llamacpp import LlamaCppEngine

    class _Oracle:
        vocab_size, max_context = 256, 4096

    with pytest.raises(InvalidSettingError, match=r"eos=300: not a token id in \[0, 256\)"):
        LlamaCppEngine(parse_llamacpp_spec(f"{tmp_path}/m.gguf,eos=300"), oracle=_Oracle())


def test_decode_grammar_skips_a_refused_grammar_with_the_reason() -> None:
    """A grammar the engine refuses by name (``UnsupportedParameterError``) is a skip, as in the other decode
    checks: refusing is allowed, ignoring is not."""
    from specproof.conformance._registry import REGISTRY
    from specproof.conformance.checks.decode_state import DecodeExample

    inv = next(i for i in REGISTRY if i.id == "decode.grammar")
    params = DecodeParams(grammar=REGEX, eos_token_ids=[0])
    example = DecodeExample(kind="grammar", prompt=(1,), max_new_tokens=8, params=params, eos_token_id=None,
                            schedule=((1, 1),))  # fmt: skip
    empty = Generation(tokens=(), stop_reason="max_new_tokens")
    run = GrammarRun(vocab_size=256, example=example, expected=empty, baseline=empty, generation=None, error=None,
                     states=None, refused="the engine refused the request: llamacpp: no")  # fmt: skip
    assert check_grammar(inv, run) == ([], 0, "the engine refused the request: llamacpp: no")
    failed = attrs.evolve(run, refused=None, error="RuntimeError: boom")
    violations, _, _ = check_grammar(inv, failed)
    assert "boom" in violations[0].explanation
