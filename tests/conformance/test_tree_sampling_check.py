"""Meta-tests of ``tree.sampled-distribution`` (docs/contract.md, "Sampled trees"): each sampled tree zoo
member rejected at quick on its id, the correct variants (both rollbacks, sample-and-match traversal)
accepted; a decoder that does not sample, a generation that raises and a search too small to see the
profile's drift each say so."""

from __future__ import annotations

from typing import Any

import pytest

from _shared_runs import SharedRuns
from specproof.conformance import certify
from specproof.conformance._tree_sampled_runs import SuiteTreeSampler, run_tree_sampled_search
from specproof.conformance.checks.tree_sampling import (
    check_sampled_distribution,
    sampled_tree_statistics,
    sensitivity_shortfall,
)
from specproof.conformance.zoo import CORRECT_TREE_SAMPLING, ZOO, small_reference
from specproof.conformance.zoo._tree_engines import TreeZooEngine
from specproof.conformance.zoo._tree_sampling_engines import TREE_SAMPLING_MEMBERS
from specproof.contract.sampling import SamplingParams

SAMPLING = "temperature=0.8,top_p=0.95"
PARAMS = SamplingParams(temperature=0.8, top_p=0.95)


def _search(engine: Any, generations: int, make: Any = None) -> Any:
    def make_decoder(target: Any, drafter: Any, max_nodes: int, max_depth: int) -> Any:
        return engine.tree_decoder(drafter, max_nodes=max_nodes, max_depth=max_depth, target=target)

    return run_tree_sampled_search(
        make or make_decoder,
        small_reference,
        params=PARAMS,
        generations=generations,
        max_new_tokens=24,
        longest_prompt=30,
        seed=0,
        alpha=1e-6,
    )


def test_the_suite_trees_are_deterministic_and_varied() -> None:
    drafter = SuiteTreeSampler(small_reference())
    trees = [drafter.propose_tree([3, 4, t], max_nodes=10, max_depth=3) for t in range(8)]
    again = SuiteTreeSampler(small_reference()).propose_tree([3, 4, 0], max_nodes=10, max_depth=3)
    assert again == trees[0]
    assert {len(t.children(-1)) for t in trees} == {2, 3} and max(t.depth for t in trees) == 3
    assert any(len(set(t.tokens[i] for i in t.children(-1))) < len(t.children(-1)) for t in trees)  # a twin
    assert all(len(t) <= 2 for t in (drafter.propose_tree([3, 4, 5], max_nodes=2, max_depth=1),))


def test_a_stale_residual_is_rejected_on_a_small_search() -> None:
    search = _search(TREE_SAMPLING_MEMBERS["tree_sampled_stale_residual"](), 64)
    violations, exercised, _ = check_sampled_distribution(search)
    assert violations and exercised > 0 and violations[0].invariant == "tree.sampled-distribution"
    stats = sampled_tree_statistics(search, tv_target=0.2)
    assert stats["false_fail_bound"] == 1e-6 and stats["configurations"][0]["tests"][-1]["test"] == "pit"  # type: ignore[index]


def test_a_search_too_small_for_the_profile_is_inconclusive() -> None:
    search = _search(TreeZooEngine(), 2)
    violations, exercised, _ = check_sampled_distribution(search)
    assert violations == [] and exercised == 48
    why = sensitivity_shortfall(search, tv_target=0.2)
    assert why is not None and "inconclusive" in why


def test_a_decoder_that_does_not_sample_is_skipped_saying_why() -> None:
    class GreedyOnly:
        def generate(self, prompt: Any, n: int, *, eos_token_id: Any = None) -> Any:
            raise AssertionError("never called")

    search = _search(None, 4, make=lambda *args: GreedyOnly())
    assert search.why_not is not None and "sampling=" in search.why_not and search.runs == []


def test_a_generation_that_raises_is_a_violation_naming_it() -> None:
    class Raises:
        def generate(self, prompt: Any, n: int, *, sampling: Any = None) -> Any:
            raise RuntimeError("kernel fault")

    search = _search(None, 4, make=lambda *args: Raises())
    violations, _, _ = check_sampled_distribution(search)
    assert len(search.runs) == 1 and "kernel fault" in violations[0].explanation


def test_without_sampling_the_check_skips_saying_how_to_ask() -> None:
    spec = CORRECT_TREE_SAMPLING["tree_zoo_engine"]
    report = certify("engine", engine=spec, only=("tree.sampled-distribution",), trees=True).to_json()
    [row] = report["results"]
    assert row["status"] == "skip" and "--sampling" in row["detail"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TREE_SAMPLING_MEMBERS))
def test_every_sampled_tree_member_is_rejected_at_quick_on_its_id(name: str, shared_runs: SharedRuns) -> None:
    member = ZOO[name]
    # the very run test_zoo.py rejects the member with: made once a session
    report = shared_runs.certify(
        "engine", engine=member.spec, only=(member.invariant,), trees=True, sampling=SAMPLING
    ).to_json()
    assert [r["status"] for r in report["results"]] == ["fail"], report["results"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORRECT_TREE_SAMPLING))
def test_correct_sampled_tree_engines_are_accepted_at_quick(name: str) -> None:
    report = certify(
        "engine",
        engine=CORRECT_TREE_SAMPLING[name],
        only=("tree.sampled-distribution",),
        trees=True,
        sampling=SAMPLING,
    ).to_json()
    [row] = report["results"]
    assert row["status"] == "pass" and row["exercised"] > 0, row
    assert row["statistics"]["configurations"][0]["generations"] == 128


def test_a_generate_that_returns_no_generation_is_named() -> None:
    class ReturnsTokens:
        def generate(self, prompt: Any, n: int, *, sampling: Any = None) -> Any:
            return [1, 2, 3]

    search = _search(None, 4, make=lambda *args: ReturnsTokens())
    violations, exercised, _ = check_sampled_distribution(search)
    assert exercised == 0 and "not a specproof.engine.Generation" in violations[0].explanation
