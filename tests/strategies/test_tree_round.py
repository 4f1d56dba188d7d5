"""The RollbackMachine's tree round (docs/contract.md, "Trees"): with tree rounds on, a correct tree target
passes under both rollbacks and tree rounds run between the other rules; a tree target whose conv windows
come from the previous node in the flattened order is found; the machine's own emission rule."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from specproof.conformance.zoo import small_reference
from specproof.conformance.zoo._tree_engines import _ConvFromPreviousNode
from specproof.contract.tree import TreeDraft
from specproof.strategies import RollbackMachineFailure, run_rollback_machine
from specproof.strategies._tree_round import expected_tree_emission

SEARCH = settings(
    max_examples=12,
    stateful_step_count=10,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)


def test_the_machine_rule_takes_the_deepest_matching_path_cut_by_budget_and_eos() -> None:
    greedy = [7, 8, 9, 10, 11]
    # a decoy first, the winner second with a child that matches, a twin of the winner with no child
    tree = TreeDraft((3, 7, 7, 8, 4), (-1, -1, -1, 1, 0))
    assert expected_tree_emission(tree, greedy, budget=5, eos=None) == [7, 8, 9]
    assert expected_tree_emission(tree, greedy, budget=2, eos=None) == [7, 8]
    assert expected_tree_emission(tree, greedy, budget=5, eos=7) == [7]
    assert expected_tree_emission(TreeDraft((1,), (-1,)), greedy, budget=5, eos=None) == [7]  # all rejected


def _small() -> object:
    return small_reference(max_context=48)


@pytest.mark.slow  # a dozen machine examples: seconds
def test_tree_rounds_run_and_a_correct_tree_target_passes() -> None:
    machine = run_rollback_machine(target_factory=_small, settings=SEARCH, sampled_rounds=False, tree_rounds=True)
    paths = machine.observed_paths
    assert paths["round:tree"] > 0 and paths["round:tree_path_kept"] > 0
    assert paths["rollback:checkpoint"] > 0 and paths["rollback:replay"] > 0


def _conv_from_previous_node() -> object:
    return _ConvFromPreviousNode(small_reference(max_context=48).config)


@pytest.mark.slow  # the failure is shrunk: seconds
def test_a_conv_window_from_the_previous_node_is_found() -> None:
    with pytest.raises(RollbackMachineFailure) as info:
        run_rollback_machine(
            target_factory=_conv_from_previous_node,
            reference_factory=_small,
            settings=SEARCH,
            sampled_rounds=False,
            tree_rounds=True,
        )
    assert info.value.prop in ("lossless", "state") and "tree_round(" in str(info.value)


def test_without_tree_rounds_the_machine_has_no_tree_rule() -> None:
    machine = run_rollback_machine(
        target_factory=_small, settings=settings(SEARCH, max_examples=2), sampled_rounds=False
    )
    assert machine.observed_paths["round:tree"] == 0
