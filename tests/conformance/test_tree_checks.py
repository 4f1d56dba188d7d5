"""Meta-tests of the tree checks: each zoo member rejected on its id, the correct variants accepted."""

from __future__ import annotations

import pytest

from specproof.conformance.checks import tree as checks
from specproof.conformance.zoo._tree_engines import TREE_CONTROLS, TREE_ZOO
from specproof.strategies._trees import TreePlan

# a non-first winner, decoys with subtrees, a twin: the shapes where per-branch bugs show
CASE = checks.TreeCase(
    prompt=(5, 6, 7, 8, 9, 10),
    plan=TreePlan(width=3, levels=3, winner_slot=1, match_levels=2, decoy_children=True),
    max_new_tokens=12,
)
CHAIN_CASE = checks.TreeCase(prompt=(5, 6, 7), plan=TreePlan(width=1, levels=4, match_levels=3), max_new_tokens=10)
TREE = ((-1, 0, 0, 1, 2, -1), (11, 12, 13, 14, 15, 16))  # parents, tokens over a context of 4

RUN_CHECKS = {
    "tree.greedy-lossless": checks.check_greedy_lossless,
    "tree.round-bounds": checks.check_round_bounds,
    "tree.committed-state": checks.check_committed_state,
    "tree.well-formed": checks.check_well_formed,
}


def _verdicts(subject: checks.TreeSubject, case: checks.TreeCase) -> dict[str, tuple[int, int]]:
    run = checks.run_tree_case(subject, case)
    out = {}
    for cid, fn in RUN_CHECKS.items():
        violations, exercised, _ = fn(subject, case, run)
        out[cid] = (len(violations), exercised)
    violations, exercised, _ = checks.check_per_node_state(subject, [5, 6, 7, 8], *TREE)
    out["tree.per-node-state"] = (len(violations), exercised)
    return out


@pytest.mark.parametrize("name", sorted(TREE_ZOO))
def test_each_tree_zoo_member_is_rejected_on_its_id(name: str) -> None:
    make, invariant = TREE_ZOO[name]
    failed, _ = _verdicts(make(), CASE)[invariant]
    assert failed, f"{name} passed {invariant}"


@pytest.mark.parametrize("name", sorted(TREE_CONTROLS))
@pytest.mark.parametrize("case", [CASE, CHAIN_CASE], ids=["tree", "chain-as-tree"])
def test_the_correct_variants_pass_every_tree_check_and_exercise_it(name: str, case: checks.TreeCase) -> None:
    verdicts = _verdicts(TREE_CONTROLS[name](), case)
    for invariant, (failed, exercised) in verdicts.items():
        assert failed == 0 and exercised > 0, (invariant, failed, exercised)


def test_a_check_that_saw_no_round_says_so() -> None:
    subject = TREE_CONTROLS["tree_checkpoint"]()
    case = checks.TreeCase(prompt=(5,), plan=TreePlan(), max_new_tokens=0)
    run = checks.run_tree_case(subject, case)
    violations, exercised, note = checks.check_round_bounds(subject, case, run)
    assert (violations, exercised) == ([], 0) and "no tree round" in note
