"""Drafters that learn across calls: the ``history_dependent`` declaration, ``SuffixDrafter`` (``suffix``)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from _shared_runs import SharedRuns
from specproof.conformance import certify, get
from specproof.conformance.checks.drafter import check_deterministic
from specproof.conformance.zoo import CORRECT_DRAFTERS, ZOO
from specproof.conformance.zoo._history_drafters import DeclaredPromptOnlyLookup, PromptOnlyLookup
from specproof.engine import PluginError, ReferenceConfig, ReferenceHybrid, SpecDecoder, greedy_decode
from specproof.engine.drafters import SuffixDrafter
from specproof.plugins import load_drafter

CTX = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 9, 1, 2]
OTHER = [7, 8, 9, 7, 8, 9, 7, 8, 1, 2, 3, 6]


def test_undeclared_prompt_only_lookup_fails_saying_how_to_declare() -> None:
    found, compared = check_deterministic(get("drafter.deterministic"), PromptOnlyLookup, CTX, [2, 3], other=OTHER)
    assert compared > 0 and len(found) == 1
    assert "history_dependent = True" in found[0].explanation
    assert "called at every position" in found[0].explanation


def test_declared_prompt_only_lookup_passes() -> None:
    found, compared = check_deterministic(
        get("drafter.deterministic"), DeclaredPromptOnlyLookup, CTX, [2, 3], other=OTHER
    )
    assert compared > 0 and found == []


class _Unreplayable(DeclaredPromptOnlyLookup):
    """Declared, but its drafts depend on a process-wide random stream: replaying the calls differs."""

    rng = random.Random(5)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return [self.rng.randrange(10)][:k]


class _ResetKeeps(SuffixDrafter):
    """Declared, but ``reset()`` keeps the earlier requests: not a fresh drafter after it."""

    def reset(self) -> None:
        docs = getattr(self, "_docs", None)
        super().reset()
        if docs is not None:
            self._docs = docs
            for i, doc in enumerate(docs):
                self._add(self._index, doc, 0, i)


def test_a_declared_drafter_must_replay_its_call_sequence() -> None:
    found, _ = check_deterministic(get("drafter.deterministic"), _Unreplayable, CTX, [2], other=OTHER)
    assert len(found) == 1 and "not replayable" in found[0].explanation


def test_a_declared_drafter_must_be_fresh_after_reset() -> None:
    found, _ = check_deterministic(get("drafter.deterministic"), _ResetKeeps, CTX, [2], other=OTHER)
    assert len(found) == 1 and "after reset()" in found[0].explanation


@pytest.mark.parametrize("name", ["declared_prompt_only_lookup", "suffix_drafter"])
def test_certify_accepts_declared_drafters(name: str) -> None:
    report = certify("drafter", drafter=CORRECT_DRAFTERS[name], profile="quick")
    assert report.verdict == "pass", [r for r in report.results if r["status"] in ("fail", "error")]


def test_certify_rejects_the_undeclared_one_with_the_declaration_in_the_message(shared_runs: SharedRuns) -> None:
    member = ZOO["prompt_only_lookup"]
    # the very run test_zoo.py rejects the member with: made once a session
    report = shared_runs.certify("drafter", drafter=member.spec, profile="quick", only=(member.invariant,))
    assert report.verdict == "fail"
    (result,) = [r for r in report.results if r["invariant"] == "drafter.deterministic"]
    assert any("history_dependent = True" in v["explanation"] for v in result["violations"])


# ------------------------------------------------------------------------------ SuffixDrafter


def test_suffix_drafts_a_repeated_request_from_the_earlier_one() -> None:
    d = SuffixDrafter(min_n=2, max_n=8)
    first = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    for n in range(2, len(first) + 1):
        d.propose(first[:n], 4)
    # a new request starting the same way: drafted from the archived one
    assert d.propose([10, 11, 12], 4) == [13, 14, 15, 16]
    assert d.history_drafts == 1 and d.requests == 2
    d.reset()
    assert d.propose([10, 11, 12], 4) == []  # a fresh session knows nothing


def test_suffix_prefers_the_current_request_and_the_longest_match() -> None:
    d = SuffixDrafter(min_n=1, max_n=4)
    assert d.propose([5, 6, 7, 1, 5, 6, 8, 1, 5, 6], 2) == [8, 1]  # latest occurrence of (1, 5, 6)
    assert d.propose([5, 6, 7, 1, 5, 6, 8, 1, 5, 6, 7], 2) == [1, 5]  # (5, 6, 7) occurs once: what followed


def test_spec_engine_keeps_the_session_and_stays_lossless() -> None:
    target = ReferenceHybrid(ReferenceConfig(d_model=32, layers=("conv", "attn"), max_context=256))
    drafter = load_drafter("suffix")
    dec = SpecDecoder(target, drafter, k=4, rollback="checkpoint")
    prompt = [3, 9, 27, 81 % 256, 1, 4]
    want = list(greedy_decode(ReferenceHybrid(target.config), prompt, 40).tokens)
    first = dec.generate(prompt, 40)
    second = dec.generate(prompt, 40)  # the same request again: drafted from the first one's output
    assert list(first.tokens) == want == list(second.tokens)
    assert second.stats is not None and first.stats is not None
    assert second.stats.rounds < first.stats.rounds
    assert drafter.history_drafts > 0


@pytest.mark.parametrize("spec", ["suffix:x", "suffix:3", "suffix:4,2", "suffix:0,3"])
def test_bad_suffix_specs_are_clear(spec: str) -> None:
    with pytest.raises(PluginError, match="suffix"):
        load_drafter(spec)


@pytest.mark.parametrize(
    ("context", "expected"),
    [([5, 9, 2] + [7] * 12, [7, 7, 7, 7]), ([1, 2, 3] * 5, [1, 2, 3, 1]), ([1, 2, 3, 4, 1, 2], [3, 4, 1, 2])],
)
def test_suffix_continues_a_loop_by_its_period(context: list[int], expected: list[int]) -> None:
    """A match that runs into the end of the context is continued by its period, k tokens deep."""
    assert SuffixDrafter().propose(context, 4) == expected


def test_suffix_drafts_the_same_from_a_growing_list_and_from_copies() -> None:
    """The fast path (the same growing list) drafts what the full comparison (fresh copies) drafts."""
    rng = random.Random(0)
    ctx = [rng.randrange(6) for _ in range(40)]
    grown, copied = SuffixDrafter(), SuffixDrafter()
    growing: list[int] = []
    for tok in ctx:
        growing.append(tok)
        assert grown.propose(growing, 4) == copied.propose(list(growing), 4)
