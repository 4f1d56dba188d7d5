"""Meta-tests of the tree checks (docs/contract.md, "Trees"): each tree zoo member rejected on its id,
the correct variants accepted, directly and through ``certify --trees``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from _shared_runs import SharedRuns
from specproof.conformance import REGISTRY, certify
from specproof.conformance.checks import tree as checks
from specproof.conformance.drivers._trees import tree_subject_of
from specproof.conformance.zoo import CORRECT_TREE, ZOO, small_reference
from specproof.conformance.zoo._tree_engines import TREE_MEMBERS, TreeReplayEngine, TreeZooEngine
from specproof.engine import greedy_decode
from specproof.strategies import TreePlan

# a non-first winner, decoys with subtrees: the shapes where per-branch bugs show
CASE = checks.TreeCase(
    prompt=(5, 6, 7, 8, 9, 10),
    plan=TreePlan(width=3, levels=3, winner_slot=1, match_levels=2, decoy_children=True),
    max_new_tokens=12,
    max_nodes=10,
    probe_parents=(-1, 0, 0, 1, 2, -1),
    probe_tokens=(11, 12, 13, 14, 15, 16),
)
CHAIN_CASE = checks.TreeCase(prompt=(5, 6, 7), plan=TreePlan(width=1, levels=4, match_levels=3), max_new_tokens=10)
CHECKS = {
    "tree.per-node-state": checks.check_per_node_state,
    "tree.greedy-lossless": checks.check_greedy_lossless,
    "tree.round-bounds": checks.check_round_bounds,
    "tree.committed-state": checks.check_committed_state,
    "tree.well-formed": checks.check_well_formed,
}


def _greedy(prompt: Sequence[int], n: int, eos: int | None) -> list[int]:
    return list(greedy_decode(small_reference(), prompt, n, eos_token_id=eos).tokens)


def _subject(engine: Any) -> checks.TreeSubject:
    subject = tree_subject_of(engine, greedy=_greedy, make_reference=small_reference, vocab_size=engine.vocab_size)
    assert subject is not None
    return subject


def _verdicts(engine: Any, case: checks.TreeCase) -> dict[str, tuple[int, int]]:
    subject = _subject(engine)
    run = checks.run_tree_case(subject, case)
    out = {}
    for cid, fn in CHECKS.items():
        violations, exercised, _ = fn(subject, case, run)
        out[cid] = (len(violations), exercised)
    return out


@pytest.mark.parametrize("name", sorted(TREE_MEMBERS))
def test_each_tree_zoo_member_fails_its_check_on_a_non_first_winner(name: str) -> None:
    failed, _ = _verdicts(TREE_MEMBERS[name](), CASE)[ZOO[name].invariant]
    assert failed, f"{name} passed {ZOO[name].invariant}"


@pytest.mark.parametrize("engine", [TreeZooEngine, TreeReplayEngine])
@pytest.mark.parametrize("case", [CASE, CHAIN_CASE], ids=["tree", "chain-as-tree"])
def test_the_correct_variants_pass_every_tree_check_and_exercise_it(engine: type, case: checks.TreeCase) -> None:
    for invariant, (failed, exercised) in _verdicts(engine(), case).items():
        assert failed == 0 and exercised > 0, (invariant, failed, exercised)


def test_a_check_that_saw_no_round_says_so() -> None:
    subject = _subject(TreeZooEngine())
    case = checks.TreeCase(prompt=(5,), plan=TreePlan(), max_new_tokens=0)
    run = checks.run_tree_case(subject, case)
    violations, exercised, note = checks.check_round_bounds(subject, case, run)
    assert (violations, exercised) == ([], 0) and "no tree round" in note


def test_the_tree_checks_skip_without_trees_saying_how_to_ask() -> None:
    report = certify("engine", engine=CORRECT_TREE["tree_zoo_engine"], only=("tree.round-bounds",)).to_json()
    [row] = report["results"]
    assert row["status"] == "skip" and "--trees" in row["detail"]


def test_an_engine_without_tree_decoder_is_skipped_saying_why() -> None:
    # (with --sampling too: without it tree.sampled-distribution says to give it, before looking at the engine)
    report = certify(
        "engine", engine="specproof.conformance.zoo:zoo_engine", only=("tree.*",), trees=True, sampling="temperature=1"
    ).to_json()
    assert {r["status"] for r in report["results"]} == {"skip"}
    assert all("tree_decoder" in r["detail"] for r in report["results"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TREE_MEMBERS))
def test_every_tree_zoo_member_is_rejected_at_quick_on_its_id(name: str, shared_runs: SharedRuns) -> None:
    member = ZOO[name]
    # the very run test_zoo.py rejects the member with: made once a session
    report = shared_runs.certify("engine", engine=member.spec, only=(member.invariant,), trees=True).to_json()
    assert [r["status"] for r in report["results"]] == ["fail"], report["results"]


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["quick", "ci"])
@pytest.mark.parametrize("name", sorted(CORRECT_TREE))
def test_correct_tree_engines_are_accepted(name: str, profile: str) -> None:
    greedy = tuple(inv.id for inv in REGISTRY if inv.driver == "tree-cases")
    report = certify("engine", engine=CORRECT_TREE[name], only=greedy, trees=True, profile=profile).to_json()
    rows = report["results"]
    assert len(rows) == 5 and all(r["status"] == "pass" and r["exercised"] > 0 for r in rows), rows
