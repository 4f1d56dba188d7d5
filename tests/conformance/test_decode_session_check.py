"""``decode.session`` (docs/contract.md, "Decode state"): the requests of a session on one engine, each judged
against plain decoding with its own decode parameters. A penalty buffer carried from one request to the next is
rejected on a hand-made user-turn session; a session-long buffer cleared per request, the control, and replay
rollback are accepted; an engine with no processors exercises nothing and says so."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from _shared_runs import SharedRuns
from specproof.conformance import get
from specproof.conformance.checks.decode_session import (
    DecodeSessionExample,
    SessionTurn,
    check_decode_session,
)
from specproof.conformance.checks.decode_state import DecodeSubject
from specproof.conformance.zoo import ZOO
from specproof.conformance.zoo._decode_engines import DecodeReplayEngine, DecodeZooEngine
from specproof.conformance.zoo._session_decode_engines import (
    OutputCarriedOver,
    PenaltyCountsCarriedOver,
    SessionPenaltyBufferCleared,
)
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import DecodeParams
from specproof.contract.decode_state import plain_decode_with

INVARIANT = get("decode.session")
PENALTIES = DecodeParams(presence_penalty=2.0, frequency_penalty=1.5)


def _subject(make_engine: Callable[[], object], features: frozenset[str] = frozenset({"penalties"})) -> DecodeSubject:
    return DecodeSubject(
        make_engine=make_engine, make_reference=small_reference, vocab_size=small_reference().vocab_size, k=4,
        features=features, takes_drafter=False, max_prompt=12, max_new_tokens=10,
    )  # fmt: skip


def _turn(relation: str, prompt: list[int], params: DecodeParams) -> SessionTurn:
    expected = plain_decode_with(small_reference(), prompt, 8, decode=params)
    return SessionTurn(
        relation=relation, prompt=tuple(prompt), max_new_tokens=8, params=params, eos_token_id=None,
        schedule=((4, 4),), expected=expected, source=expected.tokens,
    )  # fmt: skip


def _session(params: DecodeParams = PENALTIES) -> DecodeSessionExample:
    first = _turn("new_prompt", [3, 1, 4, 1, 5], params)
    turn = [*first.prompt, *first.expected.tokens, 4, 4]
    return DecodeSessionExample(turns=(first, _turn("user_turn", turn, params), _turn("regenerate", turn, params)))


def test_counts_carried_into_the_next_request_are_rejected_naming_the_request() -> None:
    violations, exercised, _ = check_decode_session(INVARIANT, _subject(PenaltyCountsCarriedOver), _session())
    [violation] = violations
    assert violation.invariant == "decode.session"
    assert "request 1 of the session (user_turn" in violation.explanation
    assert violation.example["failing_request"] == 1 and "decode" in violation.example
    assert exercised == 1


def test_the_previous_output_counted_toward_min_tokens_is_rejected() -> None:
    """``min_tokens`` 3 against an EOS id plain decoding would emit second: a count that starts from the
    session's earlier output unmasks it at once."""
    first = _turn("new_prompt", [3, 1, 4, 1, 5], PENALTIES)
    prompt = [*first.prompt, *first.expected.tokens, 4, 4]
    free = plain_decode_with(small_reference(), prompt, 8, decode=PENALTIES).tokens
    assert free[1] not in free[:1]  # the EOS id's first place is 1, under min_tokens
    second = _turn("user_turn", prompt, attrs.evolve(PENALTIES, min_tokens=3, eos_token_ids=[free[1]]))
    session = DecodeSessionExample(turns=(first, second))
    [violation] = check_decode_session(INVARIANT, _subject(OutputCarriedOver), session)[0]
    assert "request 1 of the session (user_turn" in violation.explanation
    assert check_decode_session(INVARIANT, _subject(DecodeZooEngine), session)[:2] == ([], 1)


@pytest.mark.parametrize("engine", [DecodeZooEngine, DecodeReplayEngine, SessionPenaltyBufferCleared])
def test_correct_engines_pass_every_request_with_the_later_ones_exercised(engine: Callable[[], object]) -> None:
    violations, exercised, note = check_decode_session(INVARIANT, _subject(engine), _session())
    assert violations == [] and note == ""
    assert exercised == 2  # both later requests: penalties on, after a request that emitted tokens


def test_without_processors_nothing_is_exercised_and_the_note_says_so() -> None:
    violations, exercised, note = check_decode_session(
        INVARIANT, _subject(PenaltyCountsCarriedOver), _session(DecodeParams())
    )
    assert (violations, exercised) == ([], 0)
    assert "no later request" in note


@pytest.mark.slow  # a certification of a few seconds
def test_the_members_are_rejected_at_quick_and_the_builtin_stack_passes_at_both_rollbacks(
    shared_runs: SharedRuns,
) -> None:
    # the runs test_zoo.py rejects the members with, and test_decode_state_checks.py passes the builtin
    # stack with (its decode.session rows): made once a session
    for name in ("penalty_counts_carried_over", "output_carried_over"):
        member = ZOO[name]
        assert member.invariant == "decode.session"
        report = shared_runs.certify("engine", engine=member.spec, only=("decode.session",), decode_state=True)
        assert [r["status"] for r in report.results] == ["fail"], report.results
    every = shared_runs.certify("engine", only=("decode.*",), decode_state=True).results
    builtin = [r for r in every if r["invariant"] == "decode.session"]
    assert [r["status"] for r in builtin] == ["pass", "pass"], builtin
    assert all(r["exercised"] > 0 for r in builtin)
