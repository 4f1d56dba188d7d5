"""Decode-time state over specproof-engine/1 (docs/protocol.md, Decode state): the ``decode`` object and the
``logprobs`` flag on ``generate``, ``final.logprobs`` and the ``stop_sequence`` stop reason, and a client
that never sends an engine a feature it does not declare (the Python test engine declares none).
"""

from __future__ import annotations

from typing import Any

import pytest

from _wire_helpers import FAKE, PY_ENGINE, start
from specproof.contract import DecodeParams, Grammar
from specproof.contract.errors import InvalidSettingError
from specproof.wire import EngineProtocolError, message_errors
from specproof.wire._decode_ask import check_decode, declared_decode_features, decode_fields

PARAMS = DecodeParams(
    repetition_penalty=1.2,
    presence_penalty=0.5,
    frequency_penalty=-0.25,
    logit_bias={7: -3.0, 12: 2.5},
    bad_words=[[1, 2], [9]],
    min_tokens=3,
    eos_token_ids=[0, 5],
    stop=[[3, 4]],
)
EVERY = frozenset({"greedy", "penalties", "logit_bias", "bad_words", "min_tokens", "stop_sequences", "logprobs"})


def _generate(**extra: Any) -> dict[str, Any]:
    return {"type": "generate", "id": 1, "prompt": [1, 2], "max_new_tokens": 4, **extra}


def test_a_generate_carries_decode_params_as_to_json_writes_them_and_asks_for_logprobs() -> None:
    fields = decode_fields(PARAMS, logprobs=True)
    assert fields == {"decode": PARAMS.to_json(), "logprobs": True}
    assert message_errors(_generate(**fields)) == []
    assert DecodeParams.from_json(fields["decode"]) == PARAMS  # type: ignore[arg-type]
    assert decode_fields(None, logprobs=False) == {}  # the message an old engine always got


@pytest.mark.parametrize(
    ("decode", "where"),
    [
        ({"top_a": 1}, "Additional properties"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"logit_bias": {"3": 500}}, "logit_bias"),
        ({"stop": [[]]}, "stop"),
        ({"min_tokens": -1}, "min_tokens"),
    ],
)
def test_the_schema_refuses_bad_decode_fields(decode: dict[str, Any], where: str) -> None:
    problems = message_errors(_generate(decode=decode))
    assert problems and where in " ".join(problems), problems


def test_a_final_may_carry_logprobs_and_stop_at_a_stop_sequence() -> None:
    final = {"type": "final", "id": 1, "tokens": [3, 4], "stop_reason": "stop_sequence", "logprobs": [-0.5, -1e-9]}
    assert message_errors(final) == []
    assert message_errors({**final, "logprobs": [0.5, -1.0]})  # a probability above 1 is no logprob
    assert message_errors({**final, "logprobs": ["-0.5", -1.0]})


def test_a_round_may_carry_the_processor_state_when_asked() -> None:
    fields = decode_fields(PARAMS, logprobs=False, processor_state=True)
    assert fields == {"decode": PARAMS.to_json(), "processor_state": True} and message_errors(_generate(**fields)) == []
    assert decode_fields(None, logprobs=False, processor_state=True) == {}  # only beside a decode
    round_ = {"type": "round", "id": 1, "round": 0, "base": 1, "draft": [4], "argmax": [4, 5], "accepted": [4, 5]}
    round_ = {**round_, "processed": 3, "processor": {"generated": 2, "counts": {"4": 1, "5": 1}}}
    assert message_errors(round_) == []
    assert message_errors({**round_, "processor": {"generated": 2, "counts": {"4": 0}}})  # a count is >= 1
    assert message_errors({**round_, "processor": {"generated": 2}})


def test_the_client_asks_only_for_what_the_engine_declares() -> None:
    declared = ("penalties", "logit_bias", "bad_words", "min_tokens", "stop_sequences", "logprobs")
    assert declared_decode_features(EVERY) == declared
    # top-n alternatives are not carried by the wire: never declared, whatever the handshake says
    assert declared_decode_features(EVERY | {"top_logprobs"}) == declared
    assert declared_decode_features(frozenset({"greedy", "state"})) == ()
    assert check_decode(PARAMS, EVERY, "e") is PARAMS
    assert check_decode(None, frozenset(), "e") is None
    assert check_decode(DecodeParams(), frozenset(), "e") is None  # all off: nothing to send
    with pytest.raises(InvalidSettingError, match=r"capabilities 'bad_words', 'min_tokens'.*nothing was sent"):
        check_decode(PARAMS, EVERY - {"bad_words", "min_tokens"}, "e")
    # extra EOS ids are a stop: an engine without stop_sequences is never sent them
    with pytest.raises(InvalidSettingError, match=r"capability 'stop_sequences'"):
        check_decode(DecodeParams(eos_token_ids=[4]), frozenset({"penalties"}), "e")
    with pytest.raises(InvalidSettingError, match=r"decode=.*DecodeParams"):
        check_decode({"min_tokens": 2}, EVERY, "e")
    with pytest.raises(InvalidSettingError, match=r"capability 'top_logprobs'"):
        check_decode(DecodeParams(logprobs=2), EVERY | {"top_logprobs"}, "e")


def test_logprobs_asked_in_decode_travel_as_the_logprobs_flag() -> None:
    # a request asking only for logprobs sends no decode object; with processors, decode without the key
    assert decode_fields(DecodeParams(logprobs=0), logprobs=False) == {"logprobs": True}
    fields = decode_fields(DecodeParams(min_tokens=2, logprobs=0), logprobs=False)
    assert fields == {"decode": DecodeParams(min_tokens=2).to_json(), "logprobs": True}
    assert message_errors(_generate(**fields)) == []


def test_stop_strings_and_grammars_have_their_wire_fields() -> None:
    grammar = Grammar(kind="regex", source="[a-c]+")
    params = DecodeParams(stop_strings=[b"ab"], grammar=grammar)
    assert message_errors(_generate(decode=params.to_json())) == []
    assert message_errors(_generate(decode={**params.to_json(), "stop_strings": [[256]]}))  # not a byte
    assert message_errors(_generate(decode={**params.to_json(), "grammar": {"kind": "ebnf", "source": "x"}}))


@pytest.mark.slow
def test_an_engine_without_the_capabilities_is_never_sent_decode_state() -> None:
    with start(PY_ENGINE, "ok", timeout=30.0) as plain:
        assert plain.decode_features is None and plain.ask_logprobs is False  # the decode checks skip it
        plain.ask_logprobs = True
        assert plain.ask_logprobs is False  # never asked of an engine that does not offer them
        before = plain.traffic["bytes_sent"]
        with pytest.raises(InvalidSettingError, match=r"does not declare the capabilit.*nothing was sent"):
            plain.generate([1, 2, 3], 4, decode=DecodeParams(frequency_penalty=1.0))
        assert plain.traffic["bytes_sent"] == before
        gen = plain.generate([1, 2, 3], 4)  # greedy without decode state works as before
        assert len(gen.tokens) == 4 and gen.logprobs is None and plain.processor_states is None


@pytest.mark.slow
def test_an_engine_that_does_not_keep_its_decode_promises_is_a_protocol_error() -> None:
    with start(FAKE, "decode-unkept", timeout=30.0) as engine:
        assert engine.decode_features == ("penalties", "logprobs") and engine.ask_logprobs
        with pytest.raises(EngineProtocolError, match="processor state, but round 0 carries none"):
            engine.generate([1, 2], 2, decode=DecodeParams(presence_penalty=1.0))
        with pytest.raises(EngineProtocolError, match="asked for logprobs, but the final carries none for 2 tokens"):
            engine.generate([1, 2], 2)
        engine.ask_logprobs = False
        assert engine.generate([1, 2], 2).logprobs is None  # not asked: not judged
