"""Meta-tests of ``tree.sampled-distribution``'s real-drafter configuration (docs/contract.md, "Sampled trees"):
a tree drafter that declares a ``q`` it did not draw from is rejected at the quick profile's size; the correct
sampled drafter (static and dynamic shapes) and a deterministic top-k drafter (one-hot ``q``) are accepted."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from specproof.conformance import certify
from specproof.conformance._registry import Outcome
from specproof.conformance._results import CheckResult
from specproof.conformance._tree_drafter_runs import ScaledModel, top_k_tree_source
from specproof.conformance._tree_sampled_runs import run_tree_sampled_search
from specproof.conformance.checks.tree_sampling import check_sampled_distribution, sampled_tree_statistics
from specproof.conformance.drivers._tree_sampling import _record
from specproof.conformance.zoo import CORRECT_TREE_SAMPLING, small_reference
from specproof.conformance.zoo._tree_engines import TreeZooEngine
from specproof.contract import Violation, ViolationError
from specproof.contract.sampling import SamplingParams
from specproof.engine.drafters._sampled_trees import TreeSampler
from specproof.engine.drafters.trees import TopKTreeDrafter

PARAMS = SamplingParams(temperature=0.8, top_p=0.95)
QUICK_GENERATIONS = 128  # the driver's at quick: 4 x 32
ALPHA = 5e-7  # the driver's per configuration


class _RankedChildren(TreeSampler):
    """Broken: each child is the top token of its row (the greedy top-k tree) declared as drawn from it."""

    def pick(self, row: np.ndarray) -> int:
        return int(np.argmax(row))


def _ranked(drafter: TopKTreeDrafter) -> TopKTreeDrafter:
    drafter.tree_sampler = _RankedChildren
    return drafter


class _Deterministic:
    """Correct, differently: the top-k tree with no declared rows (the engine takes them one-hot)."""

    def __init__(self, inner: TopKTreeDrafter) -> None:
        self.inner, self.vocab_size, self.name = inner, inner.vocab_size, "deterministic top-k"

    def reset(self) -> None:
        self.inner.reset()

    def propose(self, context: Any, k: int) -> list[int]:
        return self.inner.propose(context, k)

    def propose_tree(self, context: Any, **kwargs: Any) -> Any:
        return self.inner.propose_tree(context, **kwargs)


def _search(shape: str, wrap: Any = None, generations: int = QUICK_GENERATIONS) -> Any:
    engine = TreeZooEngine()

    def make_decoder(target: Any, drafter: Any, max_nodes: int, max_depth: int) -> Any:
        return engine.tree_decoder(drafter, max_nodes=max_nodes, max_depth=max_depth, target=target)

    return run_tree_sampled_search(
        make_decoder,
        small_reference,
        params=PARAMS,
        generations=generations,
        max_new_tokens=24,
        longest_prompt=30,
        seed=0,
        alpha=ALPHA,
        source=top_k_tree_source(shape, wrap=wrap),
    )


def test_the_draft_model_is_the_oracle_sharpened() -> None:
    model = ScaledModel(small_reference(), 1.5)
    want = np.asarray(small_reference().forward([3, 4, 5]), dtype=np.float64) * 1.5
    np.testing.assert_allclose(model.forward([3, 4, 5]), want)
    snap = model.snapshot()
    model.forward([6])
    model.restore(snap)
    assert model.processed == 3 and model.vocab_size == 64


@pytest.mark.slow
def test_top_k_children_declared_as_drawn_from_q_are_rejected_at_quick_size() -> None:
    search = _search("2x2x2", _ranked)
    violations, exercised, _ = check_sampled_distribution(search)
    assert violations and exercised > 0
    assert {v.invariant for v in violations} == {"tree.sampled-distribution"}
    assert len(search.runs) <= QUICK_GENERATIONS and search.configuration == "rejection/top-k-tree-drafter(2x2x2)"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["2x2x2", "dynamic:10"])
def test_the_sampled_tree_drafter_is_accepted(shape: str) -> None:
    search = _search(shape)
    violations, exercised, notes = check_sampled_distribution(search)
    assert violations == [] and exercised == QUICK_GENERATIONS * 24, notes
    stats = sampled_tree_statistics(search, tv_target=0.2)
    assert stats["configurations"][0]["name"] == f"rejection/top-k-tree-drafter({shape})"  # type: ignore[index]


@pytest.mark.slow
def test_a_deterministic_top_k_tree_drafter_is_accepted() -> None:
    search = _search("2x2x2", _Deterministic, generations=64)
    violations, exercised, _ = check_sampled_distribution(search)
    assert violations == [] and exercised == 64 * 24


@pytest.mark.slow
def test_certify_runs_both_configurations_and_passes_the_correct_engine() -> None:
    report = certify(
        "engine",
        engine=CORRECT_TREE_SAMPLING["tree_zoo_engine"],
        only=("tree.sampled-distribution",),
        trees=True,
        sampling="temperature=0.8,top_p=0.95",
    ).to_json()
    [row] = report["results"]
    assert row["status"] == "pass" and row["exercised"] > 0, row
    names = [c["name"] for c in row["statistics"]["configurations"]]
    assert names == ["rejection/suite-tree-drafts", "rejection/top-k-tree-drafter(2x2x2)"]
    assert row["statistics"]["false_fail_bound"] == pytest.approx(1e-6)


def _outcome(*, bad: bool = False, exercised: int = 10, note: str = "held", name: str = "c") -> Outcome:
    violations = [Violation(invariant="tree.sampled-distribution", explanation=f"{name} moved")] if bad else []
    stats = {"scope": "check", "false_fail_bound": 5e-7, "configurations": [{"name": name, "false_fail_bound": 5e-7}]}
    return Outcome(violations, exercised=exercised, note=note, statistics=stats)


def test_the_driver_joins_both_configurations_into_one_result() -> None:
    result = CheckResult(nodeid="n", invariant="tree.sampled-distribution", case="c")
    _record(result, [_outcome(name="suite"), _outcome(name="drafter")])
    assert result.exercised == 20 and result.status == "pending"  # settled later as a pass
    assert [c["name"] for c in result.statistics["configurations"]] == ["suite", "drafter"]  # type: ignore[index]
    assert result.statistics["false_fail_bound"] == pytest.approx(1e-6)  # type: ignore[index]
    failed = CheckResult(nodeid="n", invariant="tree.sampled-distribution", case="c")
    with pytest.raises(ViolationError, match="drafter moved"):
        _record(failed, [_outcome(name="suite"), _outcome(bad=True, name="drafter")])
    weak = CheckResult(nodeid="n", invariant="tree.sampled-distribution", case="c")
    _record(weak, [_outcome(), _outcome(exercised=0, note="the event 'top' detects 0.3: inconclusive\nmore")])
    assert weak.status == "skip" and "inconclusive" in weak.detail and weak.exercised == 0
