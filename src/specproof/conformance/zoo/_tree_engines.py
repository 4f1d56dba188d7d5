"""Tree engines: the reference tree decoder and tree target with one planted bug each (docs/contract.md,
"Trees"), in the shapes of public reports: a tree verified as a chain and the accepted index computed as if
the tree were a chain (SGLang #27463), a sibling's recurrent state leaking into the next sibling and a conv
window taken from the previous node in the flattened order instead of the parent (vLLM #29846, SGLang #11133:
parent pointers in the conv and GDN kernels), the committed state the first sibling's when another won, a
rejected sibling's KV rows left visible to later rounds, the bonus token read from the wrong node's row.
``TreeZooEngine`` is their control and ``TreeReplayEngine`` a correct variant (a chain declared as a tree is
the suite's plan of width 1, which every tree run also decodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs
import numpy as np

from specproof.conformance.zoo._engines import ZooEngine
from specproof.contract.tree import TreeDraft, TreeVerdict, greedy_tree_accept
from specproof.engine import TreeRound, TreeSpecDecoder
from specproof.engine.targets.reference import ReferenceHybrid

__all__ = ["TREE_MEMBERS", "TreeReplayEngine", "TreeZooEngine"]


class _ChainVerifiedTarget(ReferenceHybrid):
    """Verifies the tree as a chain: every node attends to, and continues the state of, the node before it
    in the flattened order (a chain mask on a tree)."""

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> tuple[Any, list[object]]:
        return super().forward_tree(tokens, tuple(range(-1, len(list(parents)) - 1)))


class _AcceptedIndexAsChain(TreeSpecDecoder):
    """Finds the right path but commits as if the tree were a chain: the kept node at depth d is taken to
    be the first node of depth d in the flattened order."""

    def _commit(
        self, tree: TreeDraft, kept: tuple[int, ...], fed: list[int], cks: list[object], before: object
    ) -> None:
        as_chain = tuple(tree.depths.index(d + 1) for d in range(len(kept)))
        super()._commit(tree, as_chain, fed, cks, before)


class _CommitsFirstSibling(TreeSpecDecoder):
    """Commits the checkpoint of the first sibling of the last kept node, whichever sibling won."""

    def _commit(
        self, tree: TreeDraft, kept: tuple[int, ...], fed: list[int], cks: list[object], before: object
    ) -> None:
        if kept:
            first = tree.children(tree.parents[kept[-1]])[0]
            kept = (*kept[:-1], first)
        super()._commit(tree, kept, fed, cks, before)


class _BonusFromNextRow(TreeSpecDecoder):
    """Reads the bonus token from the row after the last kept node's in the flattened order."""

    def _accept(self, tree: TreeDraft, logits: np.ndarray) -> TreeVerdict:
        right = greedy_tree_accept(tree, logits)
        last = right.path[-1] if right.path else -1
        row = min(last + 2, len(logits) - 1)
        return attrs.evolve(right, accepted=(*right.accepted[:-1], int(np.argmax(logits[row]))))


class _SiblingStateLeak(ReferenceHybrid):
    """The recurrent state of a node continues from its previous sibling's, when it has one."""

    def _tree_sources(self, parents: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        rec = tuple(next((j for j in range(i - 1, -1, -1) if parents[j] == p), p) for i, p in enumerate(parents))
        return parents, rec


class _ConvFromPreviousNode(ReferenceHybrid):
    """The conv windows continue from the previous node in the flattened order, not the parent."""

    def _tree_sources(self, parents: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(range(-1, len(parents) - 1)), parents


class _StaleSiblingKV(ReferenceHybrid):
    """A node's checkpoint restores the KV rows the tree forward left in the cache (at each depth the row of
    the LAST node of that depth in the flattened order) instead of its root path's: when an earlier sibling
    wins, a rejected sibling's keys and values stay visible to every later round. Tokens, conv and
    recurrent state of the round itself are right."""

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> tuple[Any, list[object]]:
        logits, cks = super().forward_tree(tokens, parents)
        tree = tuple(parents)
        depth_of: list[int] = []  # parents come before children
        for p in tree:
            depth_of.append(1 if p < 0 else depth_of[p] + 1)
        last_at = {d: max(i for i in range(len(tree)) if depth_of[i] == d) for d in set(depth_of)}
        stale = []
        for i, ck in enumerate(cks):
            rows = [last_at[d + 1] for d in range(depth_of[i])]
            keys = np.stack([cks[j].path_keys_t[..., d] for d, j in enumerate(rows)], axis=-1)  # type: ignore[attr-defined]
            values = np.stack([cks[j].path_values[:, :, d] for d, j in enumerate(rows)], axis=2)  # type: ignore[attr-defined]
            stale.append(attrs.evolve(ck, path_keys_t=keys, path_values=values))  # type: ignore[misc]
        return logits, stale


class _ReportsChainIndices(TreeSpecDecoder):
    """Decodes right but reports the accepted nodes as the first node at each depth."""

    def _record(self, round_: TreeRound) -> TreeRound:
        as_chain = tuple(round_.tree.depths.index(d + 1) for d in range(len(round_.path)))
        return attrs.evolve(round_, path=as_chain)


class _IgnoresDepthBudget(TreeSpecDecoder):
    """Asks for trees as deep as its own max_depth, whatever the tokens still wanted."""

    def _budget(self, depth: int) -> tuple[int, int]:
        return self.max_nodes, self.max_depth


class TreeZooEngine(ZooEngine):
    """The tree engines' control: the zoo engine, which also verifies token trees with the reference tree
    decoder on its model (checkpoint rollback)."""

    tree_decoder_class: type[TreeSpecDecoder] = TreeSpecDecoder
    tree_target_class: type[ReferenceHybrid] = ReferenceHybrid
    tree_rollback = "checkpoint"

    def tree_target(self) -> ReferenceHybrid:
        """A fresh tree target: the engine's model, for the white-box per-node check."""
        return self.tree_target_class(self.target.config)

    def tree_decoder(self, drafter: Any, *, max_nodes: int, max_depth: int, target: Any = None) -> TreeSpecDecoder:
        """A tree decoder with ``drafter`` over ``target`` (None: a fresh ``tree_target()``)."""
        tgt = self.tree_target() if target is None else target
        return self.tree_decoder_class(
            tgt,
            drafter,
            max_nodes=max_nodes,
            max_depth=max_depth,
            rollback=self.tree_rollback,  # type: ignore[arg-type]
        )


class TreeReplayEngine(TreeZooEngine):
    """Correct, differently: tree rounds roll back by replay (restore, re-feed the accepted path)."""

    tree_rollback = "replay"


class TreeVerifiedAsChain(TreeZooEngine):
    """The tree is verified as a chain (each node sees the node before it in the
    flattened order, not its parent), as one SGLang attention backend did (#27463)."""

    tree_target_class = _ChainVerifiedTarget


class TreeAcceptedIndexAsChain(TreeZooEngine):
    """The right path is found but its state is committed as if the tree were a
    chain (the first node at each depth), SGLang #27463."""

    tree_decoder_class = _AcceptedIndexAsChain


class TreeSiblingStateLeak(TreeZooEngine):
    """A node's recurrent state continues from its previous sibling's, not its parent's."""

    tree_target_class = _SiblingStateLeak


class TreeConvFromPreviousNode(TreeZooEngine):
    """The conv window continues from the previous node in the flattened order, not
    the parent (parent pointers in the conv kernel, vLLM #29846)."""

    tree_target_class = _ConvFromPreviousNode


class TreeCommitsFirstSibling(TreeZooEngine):
    """The state committed is the first sibling's when another sibling won."""

    tree_decoder_class = _CommitsFirstSibling


class TreeBonusFromWrongRow(TreeZooEngine):
    """The bonus token is read from the row after the winner's in the flattened order."""

    tree_decoder_class = _BonusFromNextRow


class TreeStaleSiblingKV(TreeZooEngine):
    """A rejected sibling's KV rows left in the cache (the last-run node's at each depth) and visible to
    later rounds when an earlier sibling won; the round's own tokens and states right."""

    tree_target_class = _StaleSiblingKV


class TreeReportsChainIndices(TreeZooEngine):
    """The round record names the first node at each depth as accepted, not the winning
    path (the accepted index computed as if the tree were a chain, in the report only)."""

    tree_decoder_class = _ReportsChainIndices


class TreeIgnoresDepthBudget(TreeZooEngine):
    """The tree's depth is not capped by the tokens still wanted: nodes past the budget (and past
    max_context) are drafted and verified."""

    tree_decoder_class = _IgnoresDepthBudget


TREE_MEMBERS: Final[dict[str, type[TreeZooEngine]]] = {
    "tree_verified_as_chain": TreeVerifiedAsChain,
    "tree_accepted_index_as_chain": TreeAcceptedIndexAsChain,
    "tree_sibling_state_leak": TreeSiblingStateLeak,
    "tree_conv_from_previous_node": TreeConvFromPreviousNode,
    "tree_commits_first_sibling": TreeCommitsFirstSibling,
    "tree_bonus_from_wrong_row": TreeBonusFromWrongRow,
    "tree_stale_sibling_kv": TreeStaleSiblingKV,
    "tree_reports_chain_indices": TreeReportsChainIndices,
    "tree_ignores_depth_budget": TreeIgnoresDepthBudget,
}
"""The tree zoo: member name -> engine class (the registry's ``zoo=`` claims each on its id)."""
