"""Tree drafts for the tree checks (docs/contract.md, "Trees"): a plan drawn by Hypothesis and the
suite's tree drafter, which scripts each round's tree from the oracle's greedy continuation.

A ``TreePlan`` shrinks towards the smallest tree (one node, the winner first, no twins or decoy
subtrees), so a failing case ends at the smallest tree that still fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from hypothesis import strategies as st

from specproof.contract.tree import TreeDraft
from specproof.contract.validation import int_at_least_validator

__all__ = ["ScriptedTreeDrafter", "TreePlan", "tree_parents", "tree_plans"]


@attrs.frozen(kw_only=True)
class TreePlan:
    """The shape of every round's tree.

    ``width`` children at each level of the main path, ``levels`` levels; the oracle's token sits at
    ``winner_slot`` among the siblings (clipped to ``width - 1``) for the first ``match_levels`` levels,
    after which every child is a decoy. ``decoy_children``: each decoy gets one child carrying the
    oracle's next token (a branch that would match if its parent were right). ``duplicate_decoys``:
    the decoys of a level share one token. ``shallow_twin``: slot 0 repeats the winner's token with no
    children, so the deeper twin must win (a branch that matches further than the first sibling).
    """

    width: int = attrs.field(default=1, validator=int_at_least_validator(1))
    levels: int = attrs.field(default=1, validator=int_at_least_validator(1))
    winner_slot: int = attrs.field(default=0, validator=int_at_least_validator(0))
    match_levels: int = attrs.field(default=1, validator=int_at_least_validator(0))
    decoy_children: bool = False
    duplicate_decoys: bool = False
    shallow_twin: bool = False

    def build(self, truth: Sequence[int], *, vocab_size: int, max_nodes: int, max_depth: int) -> TreeDraft:
        """This plan's tree for a context whose greedy continuation starts with ``truth``."""
        tokens: list[int] = []
        parents: list[int] = []

        def add(token: int, parent: int) -> int | None:
            if len(tokens) >= max_nodes:
                return None
            tokens.append(token % vocab_size)
            parents.append(parent)
            return len(tokens) - 1

        slot = min(self.winner_slot, self.width - 1)
        cur = -1
        levels = min(self.levels, max_depth)
        for level in range(levels):
            anchor = truth[level] if level < len(truth) else level
            right = level < self.match_levels and level < len(truth)
            nxt = truth[level + 1] if level + 1 < len(truth) else anchor
            winner: int | None = None
            decoys: list[int] = []
            for s in range(self.width):
                if s == slot:
                    token = anchor if right else anchor + 1 + self.width
                    winner = add(token, cur)
                elif s == 0 and self.shallow_twin and right:
                    add(anchor, cur)  # a twin of the winner with no subtree
                else:
                    node = add(anchor + 1 + (0 if self.duplicate_decoys else s), cur)
                    if node is not None:
                        decoys.append(node)
            if self.decoy_children and level + 1 < levels:
                for node in decoys:
                    add(nxt, node)
            if winner is None:
                break
            cur = winner
        return TreeDraft(tuple(tokens), tuple(parents))


@st.composite
def tree_plans(draw: st.DrawFn, *, max_width: int = 3, max_levels: int = 4) -> TreePlan:
    """Tree plans up to ``max_width`` x ``max_levels``. The winner's slot and the matching levels are drawn
    counted from the end, so the simple draws Hypothesis favours (and shrinks to) have the winner last
    among its siblings (not first, where a tree bug hides behind chain behaviour) and every level matching."""
    width = draw(st.integers(1, max_width))
    levels = draw(st.integers(1, max_levels))
    return TreePlan(
        width=width,
        levels=levels,
        winner_slot=width - 1 - draw(st.integers(0, width - 1)),
        match_levels=levels - draw(st.integers(0, levels)),
        decoy_children=draw(st.booleans()),
        duplicate_decoys=draw(st.booleans()),
        shallow_twin=draw(st.booleans()),
    )


@st.composite
def tree_parents(draw: st.DrawFn, *, max_nodes: int = 8) -> tuple[int, ...]:
    """Arbitrary parent pointers (parents before children), shrinking to one root."""
    n = draw(st.integers(1, max_nodes))
    return tuple(draw(st.integers(-1, i - 1)) for i in range(n))


class ScriptedTreeDrafter:
    """The suite's tree drafter: each round's tree is ``plan.build`` over the oracle's continuation of
    the context (``reference``: the prompt followed by plain greedy's output); a context that left the
    reference gets decoys only."""

    def __init__(self, plan: TreePlan, reference: Sequence[int], *, vocab_size: int) -> None:
        self.plan = plan
        self.reference = tuple(int(t) for t in reference)
        self.vocab_size = vocab_size
        self.trees: list[TreeDraft] = []  # every tree proposed, for tree.well-formed

    def reset(self) -> None:
        self.trees.clear()

    def propose_tree(self, context: Sequence[int], *, max_nodes: int, max_depth: int) -> TreeDraft:
        n = len(context)
        on_track = tuple(context) == self.reference[:n]
        truth = self.reference[n:] if on_track else ()
        tree = self.plan.build(truth, vocab_size=self.vocab_size, max_nodes=max_nodes, max_depth=max_depth)
        self.trees.append(tree)
        return tree
