"""Drafter checks over the coverage model of requests: every call of the relation walk judged by every per-call
invariant, each relation's broken drafter caught on it, and a relation never reached inconclusive, not a pass."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from specproof.conformance import certify
from specproof.conformance._registry import get
from specproof.conformance._results import CheckResult
from specproof.conformance.checks._relation_walk import applicable_tags, relation_walk
from specproof.conformance.checks.drafter import (
    check_deterministic,
    check_max_length,
    check_no_mutation,
    check_token_range,
)
from specproof.conformance.reports import request_coverage_lines, unreached_relations
from specproof.conformance.zoo._drafters import LookupDrafter
from specproof.conformance.zoo._relation_drafters import (
    DepthGrowsOverRequests,
    DraftCacheIgnoresK,
    EarlyEditKeepsIndex,
    IncrementalLookup,
    ResetKeepsIndexPointer,
)
from specproof.strategies import REQUEST_COVERAGE

CTX = [3, 5, 7, 3, 5, 9, 3, 5, 7, 11, 3, 5, 7, 3, 12, 3, 5, 7]
OTHER = [20, 21, 3, 5, 22, 20, 21, 23, 20, 21, 24]
WALK = {"other": OTHER, "prompt": 8, "accepts": [2, 8, 1], "vocab_size": 64}


class _NoReset(LookupDrafter):
    """The control, which has no reset()."""


class _OutOfRangeAfterReset(IncrementalLookup):
    """Pads with the id ``vocab_size`` once it has been reset: only calls after reset() show it."""

    was_reset = False

    def reset(self) -> None:
        super().reset()
        self.was_reset = True

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        draft = super().propose(context, k)
        return draft + [64] * (k - len(draft)) if self.was_reset else draft


class _MutatesOnRegenerate(IncrementalLookup):
    """Appends a token to the list when it is asked about the context it holds again (a regenerate)."""

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        again = list(context) == self._held
        draft = super().propose(context, k)
        if again and isinstance(context, list):
            context.append(0)
        return draft


def test_the_walk_reaches_every_relation_and_judges_each_call() -> None:
    calls, reached = relation_walk(
        IncrementalLookup(), CTX, OTHER, prompt=8, ks=[2, 3], accepts=[2, 8, 1], vocab_size=64
    )
    assert set(reached) == set(REQUEST_COVERAGE) and all(reached.values()), reached
    assert sum(reached[r] for r in ("fresh", "same", "continuation")) <= len(calls)


def test_a_drafter_without_reset_is_not_held_to_the_reset_relations() -> None:
    _, reached = relation_walk(_NoReset(), CTX, OTHER, prompt=8, ks=[2], accepts=[1], vocab_size=64)
    assert "after_reset" not in reached and "after_reset" not in applicable_tags(_NoReset())
    assert all(reached.values()), reached


@pytest.mark.parametrize(
    ("make", "check", "tag", "phrase"),
    [
        # no one relation: its third new request (an edit, a shorter prefix...) is where the depth passes k
        (DepthGrowsOverRequests, "drafter.max-length", None, "asked for at most k="),
        (DraftCacheIgnoresK, "drafter.max-length", "k_smaller", "asked for at most k="),
        (_OutOfRangeAfterReset, "drafter.token-range", "after_reset", "is not an int id in [0, 64)"),
        (_MutatesOnRegenerate, "drafter.no-mutation", "same", "propose changed the context it was given"),
        (ResetKeepsIndexPointer, "drafter.deterministic", "after_reset", "proposed differently than a fresh drafter"),
        (EarlyEditKeepsIndex, "drafter.deterministic", "edit_early", "proposed differently than a fresh drafter"),
    ],
)
def test_each_relations_bug_is_caught_on_its_call(make: Any, check: str, tag: str | None, phrase: str) -> None:
    inv = get(check)
    reached: Counter[str] = Counter()
    if check == "drafter.deterministic":
        found, _ = check_deterministic(inv, make, CTX, [2, 3], coverage=reached, **WALK)
    elif check == "drafter.no-mutation":
        found, _ = check_no_mutation(inv, make(), CTX, [2, 3], coverage=reached, **WALK)
    elif check == "drafter.token-range":
        found = check_token_range(inv, make(), CTX, [2, 3], coverage=reached, **WALK)
    else:
        found = check_max_length(inv, make(), CTX, [2, 3], coverage=reached, **WALK)
    assert len(found) == 1, found
    explanation = found[0].explanation
    assert phrase in explanation and "of a walk of requests" in explanation, explanation
    walk = found[0].example["walk"]
    assert walk[-1]["call"] == found[0].example["call"] and walk[-1]["relation"] == found[0].example["relation"]
    # the relation that exposes it is the failing call's, or the call's right before (the stale state it left)
    assert tag is None or any(tag in step["relation"] for step in walk[-2:]), walk[-2:]


@pytest.mark.parametrize("make", [LookupDrafter, IncrementalLookup, _NoReset])
def test_correct_drafters_pass_every_call(make: Any) -> None:
    for check in ("drafter.max-length", "drafter.token-range"):
        fn = check_max_length if check == "drafter.max-length" else check_token_range
        assert fn(get(check), make(), CTX, [0, 2, 5], **WALK) == []  # type: ignore[operator]
    found, compared = check_deterministic(get("drafter.deterministic"), make, CTX, [0, 2, 5], **WALK)
    assert found == [] and compared > len(CTX)
    found, checked = check_no_mutation(get("drafter.no-mutation"), make(), CTX, [0, 2, 5], **WALK)
    assert found == [] and checked > len(CTX)


def test_a_relation_never_reached_is_inconclusive_not_a_pass() -> None:
    result = CheckResult(nodeid="drafter.max-length", invariant="drafter.max-length", case="drafter", exercised=9)
    result.relations.update({"fresh": 3, "shared_block": 0})
    result.settle()
    assert (result.status, result.detail) == ("skip", "inconclusive: request relations never reached: shared_block")
    report = {"results": [result.to_json()]}
    assert unreached_relations(report["results"]) == {"drafter.max-length": ["shared_block"]}
    assert request_coverage_lines(report) == [
        "",
        "## Request coverage (calls or requests by relation to the one before)",
        "",
        "| check | fresh | shared_block |",
        "|---|---:|---:|",
        "| drafter.max-length | 3 | 0 |",
        "",
        "Never reached (inconclusive): drafter.max-length: shared_block.",
    ]


@pytest.mark.slow
def test_the_built_in_stack_reaches_every_relation_at_quick() -> None:
    """certify --profile quick on the built-in drafter: no relation at 0, on screen, markdown and JSON."""
    report = certify("drafter", profile="quick", only=("drafter.*",)).to_json()
    rows = {r["invariant"]: r.get("request_coverage") for r in report["results"] if r.get("request_coverage")}
    assert set(rows) == {"drafter.max-length", "drafter.token-range", "drafter.deterministic", "drafter.no-mutation"}
    for counts in rows.values():
        assert set(counts) == set(REQUEST_COVERAGE) and all(counts.values()), counts
    assert report["verdict"] == "pass", report["verdict_reason"]


@pytest.mark.slow
def test_a_session_engine_reaches_every_relation_at_quick() -> None:
    report = certify(
        "engine", engine="specproof.conformance.zoo:session_engine", profile="quick", only=("engine.session",)
    ).to_json()
    [result] = report["results"]
    counts = result["request_coverage"]
    assert result["status"] == "pass" and all(counts.values()), counts
    assert "k_smaller" not in counts  # the engine's k is its own
