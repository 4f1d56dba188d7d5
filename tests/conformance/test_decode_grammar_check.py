"""decode.grammar judges an engine black-box too (docs/contract.md, "Grammars"): without a reported matcher
state it still rejects a matcher one token behind or never rolled back (here the reference's own guard
refuses the token the wrong matcher forbids, and the failed generation is the violation), and it accepts
the correct engine, exercised, with and without the state."""

from __future__ import annotations

import attrs
import pytest

from specproof.conformance._registry import get
from specproof.conformance.checks.decode_grammar import GrammarRun, check_grammar, grammars, run_grammar_example
from specproof.conformance.checks.decode_state import DecodeExample, DecodeSubject
from specproof.conformance.zoo._decode_engines import DecodeZooEngine
from specproof.conformance.zoo._grammar_engines import GrammarNotRolledBack, GrammarOneBehindAfterBlock
from specproof.conformance.zoo._targets import small_reference
from specproof.contract import DecodeParams

GRAMMARS = grammars()

INV = get("decode.grammar")


def _run(make_engine: type, schedule: tuple[tuple[int, int], ...]) -> GrammarRun:
    subject = DecodeSubject(
        make_engine=make_engine,
        make_reference=small_reference,
        vocab_size=64,
        k=4,
        features=frozenset(),
        takes_drafter=True,
        max_prompt=16,
        max_new_tokens=20,
    )
    params = DecodeParams(grammar=GRAMMARS[0], eos_token_ids=[63])
    example = DecodeExample(
        kind="grammar", prompt=(1, 2, 3), max_new_tokens=20, params=params, eos_token_id=None, schedule=schedule
    )
    return run_grammar_example(subject, example)


@pytest.mark.parametrize(
    ("engine", "schedule"),
    [(GrammarOneBehindAfterBlock, ((4, 4),)), (GrammarNotRolledBack, ((4, 1), (4, 0), (3, 2)))],
)
def test_black_box_the_check_still_rejects_a_wrong_matcher(engine: type, schedule: tuple[tuple[int, int], ...]) -> None:
    run = _run(engine, schedule)
    white, _, _ = check_grammar(INV, run)
    black, _, _ = check_grammar(INV, attrs.evolve(run, states=None))
    assert white and black
    assert all(v.invariant == "decode.grammar" for v in [*white, *black])


def test_black_box_the_correct_engine_passes_and_is_exercised() -> None:
    run = _run(DecodeZooEngine, ((4, 4), (4, 1), (2, 0)))
    for judged in (run, attrs.evolve(run, states=None)):
        violations, exercised, note = check_grammar(INV, judged)
        assert violations == [] and exercised == 1, note
