"""Tie-aware losslessness: exact on identical runs, excused only on near-ties, failing otherwise."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _targets import small_target
from specproof.conformance import Capabilities, RunRecord, get
from specproof.conformance.checks import LosslessVerdict, compare_lossless, summarise_verdicts
from specproof.engine import Generation, InvalidSettingError, NgramDrafter, SpecDecoder, greedy_with_margins

TARGET = small_target()
VOCAB = TARGET.vocab_size


def _record(tokens: list[int], verdict: LosslessVerdict) -> RunRecord:
    gen = Generation(tokens=tokens, stop_reason="max_new_tokens")
    caps = Capabilities(has={"oracle"})
    return RunRecord(
        generation=gen, prompt=[0], k=0, max_new_tokens=len(tokens), eos=None, lossless=verdict, capabilities=caps
    )


def test_identical_runs_pass():
    v = compare_lossless([1, 2, 3], [1, 2, 3])
    assert v.status == "pass" and v.ok and v.index is None and v.breach() is None and v.compared == 3


def test_a_divergence_fails_with_index_tokens_and_margin():
    v = compare_lossless([1, 2, 7, 4], [1, 2, 3, 4], expected_margins=[1.0, 1.0, 0.5, 1.0], tie_tolerance=0.1)
    assert v.status == "fail" and not v.ok
    assert (v.index, v.margin, v.compared) == (2, 0.5, 2)
    breach = v.breach()
    assert breach is not None and (breach["expected"], breach["actual"]) == (3, 7)
    assert breach["example"] == {"index": 2, "margin": 0.5}
    # the judge names the invariant, never the comparison (docs/contract.md, "the registry")
    (found,) = get("engine.lossless").judge_record(_record([1, 2, 7], v)).violations
    assert found.invariant == "engine.lossless" and (found.expected, found.actual) == (3, 7)
    assert "token 2 differs" in v.explanation and "not a near-tie" in v.explanation


def test_a_near_tie_is_excused_and_the_rest_is_not_compared():
    v = compare_lossless([1, 2, 7, 9, 9], [1, 2, 3, 4, 5], expected_margins=[1.0, 1.0, 1e-6, 1.0], tie_tolerance=1e-4)
    assert v.status == "excused" and v.ok and v.index == 2 and v.margin == 1e-6 and v.breach() is None
    assert "cannot be compared" in v.explanation and "2 token(s) after it" in v.explanation


def test_tie_tolerance_zero_is_an_exact_gate():
    v = compare_lossless([1, 7], [1, 3], expected_margins=[1.0, 0.0], tie_tolerance=0.0)
    assert v.status == "fail" and "exact" in v.explanation


def test_the_smaller_margin_of_the_two_runs_decides():
    kw = dict(tie_tolerance=0.01)
    assert compare_lossless([7], [3], expected_margins=[0.5], actual_margins=[0.001], **kw).status == "excused"
    assert compare_lossless([7], [3], expected_margins=[0.001], actual_margins=[0.5], **kw).status == "excused"
    assert compare_lossless([7], [3], expected_margins=[0.5], actual_margins=[0.02], **kw).status == "fail"


def test_without_a_margin_nothing_is_excused():
    v = compare_lossless([1, 7], [1, 3], expected_margins=[0.0], tie_tolerance=1.0)  # margins too short
    assert v.status == "fail" and v.margin is None and "no margin was recorded" in v.explanation


def test_stopping_short_fails_unless_the_stop_reason_explains_it():
    v = compare_lossless([1, 2], [1, 2, 3])
    assert v.status == "fail" and v.index == 2 and v.expected == 3 and v.actual is None
    assert "token 2 (3) is missing" in v.explanation
    assert compare_lossless([1, 2], [1, 2, 3], actual_stop_reason="max_new_tokens").status == "fail"
    assert compare_lossless([1, 2], [1, 2, 3], actual_stop_reason="eos").status == "pass"
    full = compare_lossless([1, 2], [1, 2, 3], actual_stop_reason="context_full")
    assert full.status == "pass" and "full context" in full.explanation
    # Both targets full, yet greedy's held more tokens: the engine stopped too early.
    both = compare_lossless([1, 2], [1, 2, 3], actual_stop_reason="context_full", expected_stop_reason="context_full")
    assert both.status == "fail"


def test_emitting_more_than_greedy_fails():
    v = compare_lossless([1, 2, 3, 4], [1, 2], expected_stop_reason="eos")
    assert v.status == "fail" and v.index == 2 and v.actual == 3 and v.expected is None
    assert "greedy stopped at EOS" in v.explanation


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"tie_tolerance": -1.0}, "tie_tolerance"),
        ({"tie_tolerance": float("nan")}, "tie_tolerance"),
        ({"expected_margins": [1.0, -0.5]}, r"expected_margins\[1\]"),
        ({"actual_margins": ["x"]}, r"actual_margins\[0\]"),
        ({"actual_stop_reason": "done"}, "actual_stop_reason"),
    ],
)
def test_bad_options_are_rejected(kw, match):
    with pytest.raises(InvalidSettingError, match=match):
        compare_lossless([1], [1], **kw)


def test_bad_tokens_are_rejected():
    with pytest.raises(InvalidSettingError, match=r"actual_tokens\[1\]"):
        compare_lossless([1, "a"], [1, 2])


def test_verdict_to_json_is_json():
    v = compare_lossless([1, 7], [1, 3], expected_margins=[1.0, float("inf")], tie_tolerance=0.5)
    data = json.loads(json.dumps(v.to_json()))
    assert data["status"] == "fail" and data["index"] == 1 and data["margin"] == "inf"
    assert (data["expected"], data["actual"]) == (3, 7)


def test_summarise_verdicts():
    verdicts = [
        compare_lossless([1], [1]),
        compare_lossless([7], [3], expected_margins=[4e-6], tie_tolerance=1e-5),
        compare_lossless([7], [3], expected_margins=[1e-6], tie_tolerance=1e-5),
        compare_lossless([7], [3], expected_margins=[2e-6], tie_tolerance=1e-5),
        compare_lossless([7], [3]),
    ]
    s = summarise_verdicts(verdicts)
    assert (s.passed, s.excused, s.failed, s.total, s.ok) == (1, 3, 1, 5, False)
    assert s.describe_excused() == "excused (3, margins 1e-06..4e-06)"
    assert str(s) == "pass 1, excused (3, margins 1e-06..4e-06), fail 1"
    assert summarise_verdicts([]).describe_excused() == "excused (0)"
    assert s.to_json()["excused_margins"] == [4e-6, 1e-6, 2e-6]
    with pytest.raises(InvalidSettingError, match="LosslessVerdict"):
        summarise_verdicts(["pass"])


@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=16),
    k=st.integers(0, 5),
    rollback=st.sampled_from(["checkpoint", "replay"]),
    max_new=st.integers(0, 24),
    eos=st.one_of(st.none(), st.integers(0, VOCAB - 1)),
)
def test_the_reference_engine_passes_the_exact_gate(prompt, k, rollback, max_new, eos):
    spec = SpecDecoder(TARGET, NgramDrafter(), k=k, rollback=rollback).generate(prompt, max_new, eos_token_id=eos)
    ref, margins = greedy_with_margins(TARGET, prompt, max_new, eos_token_id=eos)
    v = compare_lossless(
        spec.tokens,
        ref.tokens,
        expected_margins=margins,
        actual_stop_reason=spec.stop_reason,
        expected_stop_reason=ref.stop_reason,
    )
    assert v.status == "pass", v.explanation


@given(
    tokens=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    data=st.data(),
)
def test_any_changed_token_fails_the_exact_gate_at_that_index(tokens, data):
    i = data.draw(st.integers(0, len(tokens) - 1))
    changed = list(tokens)
    changed[i] = (changed[i] + data.draw(st.integers(1, VOCAB - 1))) % VOCAB
    margins = data.draw(st.lists(st.floats(0, 10), min_size=len(tokens), max_size=len(tokens)))
    v = compare_lossless(changed, tokens, expected_margins=margins)
    assert isinstance(v, LosslessVerdict)
    assert v.status == "fail" and v.index == i
    # With a tolerance above the margin there, the same divergence is excused instead.
    assert compare_lossless(changed, tokens, expected_margins=margins, tie_tolerance=margins[i] + 1).status == "excused"
