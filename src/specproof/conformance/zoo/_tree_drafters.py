"""Tree drafters: top-k trees over the ``trained-small`` draft model, two with a bug in the tree they return.

The control is ``TopKTreeDrafter`` at the 2x2x2 shape; correct and different: the dynamic (EAGLE-2) tree and
the n-gram tree. Two break ``drafter.tree-well-formed``: a tree listed children first (a kernel walking it
in order reads a parent's state before it exists), and one that ignores the call's node budget (the engine
sized its tree buffers for ``max_nodes``). One breaks ``drafter.tree-deterministic``: its draft model is
left on the last branch it expanded (no rollback to the context after the tree), so the next call's
catch-up continues from that branch's state.
"""

from __future__ import annotations

from collections.abc import Sequence

from specproof.contract.tree import TreeDraft
from specproof.engine.drafters.model import ModelDrafter
from specproof.engine.drafters.trees import NgramTreeDrafter, TopKTreeDrafter, _ModelRows
from specproof.plugins import load_target

__all__ = [
    "TREE_DRAFTER_MEMBERS",
    "TreeChildBeforeParent",
    "TreeLeftOnLastBranch",
    "TreeOverBudget",
    "dynamic_tree_drafter",
    "ngram_tree_drafter",
    "tree_drafter",
]

DRAFT_MODEL = "trained-small"


def _model() -> ModelDrafter:
    return ModelDrafter(load_target(DRAFT_MODEL))


class TreeChildBeforeParent(TopKTreeDrafter):
    """Lists its tree deepest level first: every child comes before its parent."""

    def __init__(self) -> None:
        super().__init__(_model(), "2x2x2")

    def propose_tree(  # type: ignore[override]
        self, context: Sequence[int], *, max_nodes: int, max_depth: int
    ) -> tuple[list[int], list[int]]:
        tree = super().propose_tree(context, max_nodes=max_nodes, max_depth=max_depth)
        order = sorted(range(len(tree)), key=lambda i: -tree.depths[i])  # the bug: leaves first
        where = {node: i for i, node in enumerate(order)}
        parents = [where[tree.parents[n]] if tree.parents[n] >= 0 else -1 for n in order]
        return [tree.tokens[n] for n in order], parents


class TreeOverBudget(TopKTreeDrafter):
    """Always proposes its whole 2x2x2 shape (14 nodes), whatever node budget the call gives."""

    def __init__(self) -> None:
        super().__init__(_model(), "2x2x2")

    def propose_tree(self, context: Sequence[int], *, max_nodes: int, max_depth: int) -> TreeDraft:  # type: ignore[override]
        return super().propose_tree(context, max_nodes=self.shape.nodes, max_depth=max_depth)  # the bug


class _RowsLeftOnBranch(_ModelRows):
    def close(self) -> None:  # the bug: the model stays where the last row was computed
        self._held = []


class TreeLeftOnLastBranch(TopKTreeDrafter):
    """Leaves its draft model on the last branch it expanded: the next call catches up from there."""

    model_rows = _RowsLeftOnBranch

    def __init__(self) -> None:
        super().__init__(_model(), "2x2x2")


def tree_drafter() -> TopKTreeDrafter:
    """Correct: the 2x2x2 top-k tree of the draft model."""
    return TopKTreeDrafter(_model(), "2x2x2")


def dynamic_tree_drafter() -> TopKTreeDrafter:
    """Correct, differently: EAGLE-2's confidence tree of 16 nodes."""
    return TopKTreeDrafter(_model(), "dynamic:16")


def ngram_tree_drafter() -> NgramTreeDrafter:
    """Correct, differently: several prompt-lookup continuations merged into one tree."""
    return NgramTreeDrafter()


TREE_DRAFTER_MEMBERS: dict[str, type] = {
    "tree_drafter_child_before_parent": TreeChildBeforeParent,
    "tree_drafter_over_budget": TreeOverBudget,
    "tree_drafter_left_on_last_branch": TreeLeftOnLastBranch,
}
