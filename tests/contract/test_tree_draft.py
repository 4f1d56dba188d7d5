"""The tree draft record and the greedy tree rule (docs/contract.md, "Trees")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specproof.contract.errors import DrafterContractError
from specproof.contract.tree import MAX_TREE_DEPTH, MAX_TREE_NODES, TreeDraft, chain_tree, greedy_tree_accept
from specproof.strategies import tree_parents


def test_a_chain_is_the_tree_with_one_child_per_node() -> None:
    tree = chain_tree([4, 5, 6])
    assert tree.parents == (-1, 0, 1) and tree.is_chain and tree.depth == 3 and tree.path(2) == [0, 1, 2]


@pytest.mark.parametrize(
    ("tokens", "parents", "problem"),
    [
        ([1, 2], [-1], "2 tokens but 1 parents"),
        ([1, 2], [-1, 1], "parents[1]=1"),
        ([1], [-2], "parents[0]=-2"),
        ([1], [True], "is not an int"),
        ("ab", [-1, 0], "sequence of ints"),
        ([0] * (MAX_TREE_NODES + 1), [-1] * (MAX_TREE_NODES + 1), "MAX_TREE_NODES"),
        (list(range(MAX_TREE_DEPTH + 1)), list(range(-1, MAX_TREE_DEPTH)), "MAX_TREE_DEPTH"),
    ],
)
def test_a_malformed_tree_is_refused_naming_the_problem(tokens: object, parents: object, problem: str) -> None:
    with pytest.raises(DrafterContractError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        TreeDraft(tokens, parents)  # type: ignore[arg-type]


def test_token_range_is_checked_against_the_vocabulary() -> None:
    with pytest.raises(DrafterContractError, match=r"tokens\[1\]=9 is outside \[0, 8\)"):
        TreeDraft([1, 9], [-1, 0]).check(8)


def _logits(argmax: list[int], vocab: int = 8) -> np.ndarray:
    rows = np.zeros((len(argmax), vocab), np.float32)
    rows[np.arange(len(argmax)), argmax] = 1.0
    return rows


def test_the_deepest_matching_path_wins_even_when_it_is_not_the_first_sibling() -> None:
    # roots 3 (twin, no children) and 3 (with child 5); the target says 3 then 5 then 7
    tree = TreeDraft([3, 3, 5], [-1, -1, 1])
    verdict = greedy_tree_accept(tree, _logits([3, 5, 5, 7]))
    assert verdict.path == (1, 2) and verdict.accepted == (3, 5, 7)


def test_every_branch_rejected_at_the_root_emits_the_bonus_only() -> None:
    verdict = greedy_tree_accept(TreeDraft([1, 2], [-1, -1]), _logits([4, 0, 0]))
    assert verdict.path == () and verdict.accepted == (4,)


@given(tree_parents(max_nodes=10), st.data())
def test_the_accepted_path_is_a_root_path_of_matching_nodes(parents: tuple[int, ...], data: st.DataObject) -> None:
    tokens = data.draw(st.lists(st.integers(0, 2), min_size=len(parents), max_size=len(parents)))
    argmax = data.draw(st.lists(st.integers(0, 2), min_size=len(parents) + 1, max_size=len(parents) + 1))
    tree = TreeDraft(tokens, parents)
    verdict = greedy_tree_accept(tree, _logits(argmax, 3))
    prev = -1
    for node in verdict.path:
        assert tree.parents[node] == prev and tree.tokens[node] == argmax[prev + 1]
        prev = node
    assert verdict.accepted[-1] == argmax[prev + 1]
    # nothing deeper matches
    depth = len(verdict.path)
    for node in range(len(tree)):
        path = tree.path(node)
        if all(tree.tokens[n] == argmax[(tree.parents[n]) + 1] for n in path):
            assert len(path) <= depth
