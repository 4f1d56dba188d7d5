"""The RollbackMachine's tree round (docs/contract.md, "Trees"): with tree rounds on, a correct tree target
passes under both rollbacks and tree rounds run between the other rules (sampled ones too); a tree target
whose conv windows come from the previous node in the flattened order is found, and so is a sampled tree rule
that does not update the residual; the machine's own emission rule."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from specproof.conformance.zoo import small_reference
from specproof.conformance.zoo._tree_engines import _ConvFromPreviousNode
from specproof.contract.tree import TreeDraft
from specproof.engine import _tree_decoder
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


def _stale_residual(tree, q, p, rng):  # type: ignore[no-untyped-def]
    """Each sibling tested against p itself and the last token drawn from p: a rejected child's token can end
    the round."""
    node, path = -1, []
    while True:
        kept = next((c for c in tree.children(node) if rng.random() < p[node + 1][tree.tokens[c]]), None)
        if kept is None:
            return tuple(path), int(rng.choice(p.shape[1], p=p[node + 1]))
        path.append(kept)
        node = kept


@pytest.mark.slow  # a dozen machine examples with sampled rounds: seconds
def test_sampled_tree_rounds_run_and_a_correct_rule_passes() -> None:
    machine = run_rollback_machine(target_factory=_small, settings=SEARCH, tree_rounds=True)
    assert machine.observed_paths["round:tree_sampled"] > 0 and machine.observed_paths["round:sampled"] > 0


@pytest.mark.slow  # the failure is shrunk: seconds
def test_a_sampled_tree_rule_without_the_residual_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tree_decoder, "sampled_tree_accept", _stale_residual)
    with pytest.raises(RollbackMachineFailure) as info:
        run_rollback_machine(target_factory=_small, settings=settings(SEARCH, max_examples=100), tree_rounds=True)
    assert info.value.prop == "sampled" and "tree_round(" in str(info.value)
