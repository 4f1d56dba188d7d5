"""A request's grammar (docs/contract.md, "Decode state"): validated in one place with errors that name the
problem, carried by DecodeParams through JSON, and plain decoding with it emits only valid prefixes."""

from __future__ import annotations

import pytest

from specproof.conformance.checks.decode_grammar import grammar_eos, grammars, usable
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import SMALL_ALPHABET, DecodeParams, Grammar, token_bytes
from specproof.contract.decode_state import OracleGrammar, first_invalid_token, grammar_state, plain_decode_with
from specproof.contract.errors import InvalidSettingError, TokenRangeError

EOS = 63  # the zoo's vocabulary: ids 56-63 stand for no text
PROMPT = (5, 9, 20, 30)


def _ids(text: bytes) -> list[int]:
    return [SMALL_ALPHABET.index(b) for b in text]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"kind": "ebnf", "source": "x"}, "is not one of"),
        ({"kind": "regex", "source": ""}, "non-empty string"),
        ({"kind": "regex", "source": "a(b"}, "unclosed group"),
        ({"kind": "lark", "source": "start: nowhere"}, "unknown name"),
        ({"kind": "json_schema", "source": "{nope"}, "is not JSON"),
        ({"kind": "json_schema", "source": '{"type": 3}'}, "is not a JSON schema"),
        ({"kind": "regex", "source": "[0-9]", "reasoning_end": "</think>"}, "sequence of token ids"),
        ({"kind": "regex", "source": "[0-9]", "reasoning_end": [1, -2]}, "not a token id"),
    ],
)
def test_a_bad_grammar_is_refused_naming_the_problem(fields: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidSettingError, match=says):
        DecodeParams(grammar=fields)


def test_the_grammar_travels_through_json_and_is_a_feature() -> None:
    params = DecodeParams(grammar=grammars()[0], eos_token_ids=[EOS])
    assert DecodeParams.from_json(params.to_json()) == params
    assert "grammar" in params.features()
    assert "grammar" not in DecodeParams().to_json()  # a request without one reads as before
    with pytest.raises(InvalidSettingError, match="unknown field"):
        DecodeParams(grammar={"kind": "regex", "source": "a", "flavour": 1})


def test_token_ids_and_the_eos_are_checked_before_any_decoding() -> None:
    with pytest.raises(TokenRangeError, match="grammar reasoning_end holds token 99"):
        DecodeParams(grammar=Grammar(kind="regex", source="[0-9]", reasoning_end=[99])).check_vocab(64)
    with pytest.raises(InvalidSettingError, match="needs an EOS id"):
        plain_decode_with(small_reference(), PROMPT, 8, decode=DecodeParams(grammar=grammars()[2]))


def test_the_vocabularies_map_ids_to_bytes() -> None:
    assert token_bytes(256)[65] == b"A" and token_bytes(300)[299] is None
    assert token_bytes(64)[:3] == (b"{", b"}", b"[") and token_bytes(64)[EOS] is None
    assert usable(64) and usable(256) and not usable(32)
    assert grammar_eos(64) == EOS and grammar_eos(256) == 0


@pytest.mark.parametrize("grammar", grammars(), ids=lambda g: g.kind)
def test_plain_decoding_with_a_grammar_emits_valid_prefixes_and_differs_from_free(grammar: Grammar) -> None:
    params = DecodeParams(grammar=grammar, eos_token_ids=[EOS])
    out = plain_decode_with(small_reference(), PROMPT, 20, decode=params)
    free = plain_decode_with(small_reference(), PROMPT, 20, decode=DecodeParams(eos_token_ids=[EOS]))
    assert first_invalid_token(grammar, frozenset({EOS}), 64, out.tokens) is None
    assert out.tokens != free.tokens and out.stop_reason == "eos"  # the grammar completes, then the EOS
    assert grammar_state(grammar, frozenset({EOS}), 64, out.tokens)["stopped"] in (True, False)
    assert first_invalid_token(grammar, frozenset({EOS}), 64, free.tokens) is not None


def test_a_reasoning_grammar_is_free_until_the_delimiter_then_constrained() -> None:
    grammar = Grammar(kind="regex", source="[0-9]{2}", reasoning_end=_ids(b"</>"))
    eos = frozenset({EOS})
    assert first_invalid_token(grammar, eos, 64, [*_ids(b"x{ </ />"), *_ids(b"42"), EOS]) is None
    assert first_invalid_token(grammar, eos, 64, [*_ids(b"ab</>4x")]) == 6
    assert first_invalid_token(grammar, eos, 64, [*_ids(b"</>4"), EOS]) == 4  # incomplete: no EOS yet
    oracle = OracleGrammar(grammar, eos, 64)
    for token in _ids(b"hm</>"):
        assert oracle.allowed() is None
        oracle.feed(token)
    allowed = oracle.allowed()
    assert allowed is not None and {int(i) for i in allowed.nonzero()[0]} == set(_ids(b"0123456789"))
    assert grammar_state(grammar, eos, 64, _ids(b"hm</>42")) == {
        "phase": "constrained",
        "fed": 2,
        "stopped": True,
        "allowed": None,
    }
