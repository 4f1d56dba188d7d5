"""``drafter.tree-well-formed`` and ``drafter.tree-deterministic``: broken tree drafters rejected at quick on
their id, correct ones accepted."""

from __future__ import annotations

from typing import Any

import pytest

from _shared_runs import SharedRuns
from specproof.conformance import certify
from specproof.conformance._registry import REGISTRY
from specproof.conformance.checks.tree_drafter import check_tree_deterministic, check_tree_well_formed, tree_problem
from specproof.contract.tree import TreeDraft
from specproof.engine.drafters import NgramDrafter

INV = next(inv for inv in REGISTRY if inv.id == "drafter.tree-well-formed")
DET = next(inv for inv in REGISTRY if inv.id == "drafter.tree-deterministic")


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (([1, 2], [-1, 0]), None),
        (TreeDraft((1, 2, 3), (-1, -1, 0)), None),
        (([1, 2], [1, -1]), "a child before its parent"),
        (([1, 2], [-1, 1]), "a child before its parent"),
        (([1, 2, 3], [-1, 0]), "3 tokens but 2 parents"),
        (([1, 2, 3, 4], [-1, -1, -1, -1]), "more than the call's max_nodes=3"),
        (([1, 2, 3], [-1, 0, 1]), "deeper than the call's max_depth=2"),
        (([1, 99], [-1, 0]), "outside [0, 64)"),
        (([1, True], [-1, 0]), "not an int"),
        ([1, 2], "not a tree"),
        (("ab", [-1]), "sequences of ints"),
    ],
)
def test_tree_problem_names_each_breach(answer: object, problem: str | None) -> None:
    got = tree_problem(answer, max_nodes=3, max_depth=2, vocab_size=64)
    assert got == problem if problem is None else problem in (got or "")


class _Chain:
    """Correct and different: the n-gram chain declared as a tree (a chain is a tree)."""

    def propose_tree(self, context: list[int], *, max_nodes: int, max_depth: int) -> tuple[list[int], list[int]]:
        tokens = NgramDrafter().propose(context, min(max_nodes, max_depth))
        return tokens, list(range(-1, len(tokens) - 1))


class _Empty:
    def propose_tree(self, context: list[int], *, max_nodes: int, max_depth: int) -> TreeDraft:
        return TreeDraft((), ())


def test_a_chain_declared_as_a_tree_passes_and_an_empty_drafter_exercises_nothing() -> None:
    calls = [(4, 4, 3), (6, 2, 2), (8, 0, 4)]
    context = [1, 2, 3, 1, 2, 3, 1, 2]
    violations, exercised, _ = check_tree_well_formed(INV, _Chain(), context, calls, vocab_size=64)
    assert violations == [] and exercised == 2
    violations, exercised, note = check_tree_well_formed(INV, _Empty(), context, calls, vocab_size=64)
    assert violations == [] and exercised == 0 and "no tree node" in note


@pytest.mark.parametrize(
    ("member", "inv"),
    [
        ("tree_drafter_child_before_parent", INV),
        ("tree_drafter_over_budget", INV),
        ("tree_drafter_left_on_last_branch", DET),
    ],
)
def test_quick_rejects_the_broken_tree_drafters_on_their_id(member: str, inv: Any, shared_runs: SharedRuns) -> None:
    # the very run test_zoo.py rejects the member with (it is the member's invariant: asserted below)
    report = shared_runs.certify(
        "drafter", drafter=f"specproof.conformance.zoo:{member}", profile="quick", only=(inv.id,)
    )
    data = report.to_json()
    assert data["verdict"] == "fail"
    (result,) = data["results"]
    assert result["invariant"] == inv.id and result["status"] == "fail"
    assert member in inv.zoo


class _Counter:
    """Broken: a tree that grows with every call (state kept between calls)."""

    def __init__(self) -> None:
        self.calls = 0

    def propose_tree(self, context: list[int], *, max_nodes: int, max_depth: int) -> tuple[list[int], list[int]]:
        self.calls += 1
        n = min(self.calls, max_nodes)
        return [1] * n, [-1] * n


def test_determinism_compares_with_a_fresh_drafter() -> None:
    calls = [(2, 4, 2), (4, 4, 2), (6, 4, 2)]
    found, _, _ = check_tree_deterministic(DET, _Counter, [1, 2, 3, 4, 5, 6], calls)
    assert len(found) == 1 and "call 1" in found[0].explanation
    found, compared, _ = check_tree_deterministic(DET, _Chain, [1, 2, 1, 2, 1, 2], calls)
    assert found == [] and compared == 2  # the first prefix, [1, 2], has no earlier match: no tree


@pytest.mark.parametrize(
    "spec",
    [
        "specproof.conformance.zoo:tree_drafter",
        "tree:dynamic:16:model:trained-small",
        "tree:4-2-1:eagle:trained",
        "tree:2x2x2:mtp:trained",
        "tree:ngram",
    ],
)
def test_quick_accepts_the_tree_drafters(spec: str) -> None:
    report = certify("drafter", drafter=spec, profile="quick", only=(INV.id, DET.id)).to_json()
    assert len(report["results"]) == 2
    for result in report["results"]:
        assert result["status"] == "pass" and result["exercised"] > 0, result


def test_a_chain_drafter_is_a_skip_that_says_why() -> None:
    report = certify("drafter", drafter="ngram", profile="quick", only=(INV.id,)).to_json()
    (result,) = report["results"]
    assert result["status"] == "skip" and "propose_tree" in result["detail"]
