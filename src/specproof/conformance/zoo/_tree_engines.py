"""Tree engines: the reference tree decoder and tree target with one planted bug each (docs/contract.md,
"Trees"), in the shapes of public reports: a tree verified as a chain and the accepted index computed as
if the tree were a chain (SGLang #27463), a sibling's
recurrent state leaking into the next sibling and a conv window taken from the previous node in the
flattened order instead of the parent (vLLM #29846, SGLang #11133: parent pointers in the conv and GDN
kernels), the committed state the first sibling's when another won, the bonus token read from the
wrong node's row. ``TREE_CONTROLS`` are correct variants (both rollbacks, a chain declared as a tree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import numpy as np

from specproof.conformance.checks.tree import TreeSubject
from specproof.conformance.zoo._targets import small_reference
from specproof.contract.tree import TreeDraft, TreeVerdict, greedy_tree_accept
from specproof.engine import greedy_decode
from specproof.engine._tree_decoder import TreeSpecDecoder
from specproof.engine.targets.reference import ReferenceHybrid

__all__ = ["TREE_CONTROLS", "TREE_ZOO", "tree_subject"]


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


def _model(cls: type[ReferenceHybrid]) -> Callable[[], ReferenceHybrid]:
    def make() -> ReferenceHybrid:
        return cls(small_reference().config)

    return make


def tree_subject(
    *,
    decoder: type[TreeSpecDecoder] = TreeSpecDecoder,
    target: type[ReferenceHybrid] = ReferenceHybrid,
    rollback: str = "checkpoint",
) -> TreeSubject:
    """The reference tree engine on the zoo's small model, with the given decoder and target classes."""
    make_target = _model(target)

    def make_decoder(tgt: Any, drafter: Any, max_nodes: int, max_depth: int) -> TreeSpecDecoder:
        return decoder(tgt, drafter, max_nodes=max_nodes, max_depth=max_depth, rollback=rollback)  # type: ignore[arg-type]

    def greedy(prompt: Sequence[int], n: int, eos: int | None) -> list[int]:
        return list(greedy_decode(small_reference(), prompt, n, eos_token_id=eos).tokens)

    return TreeSubject(
        make_decoder=make_decoder,
        make_target=make_target,
        make_reference=small_reference,
        greedy=greedy,
        vocab_size=small_reference().vocab_size,
    )


TREE_ZOO: Final[dict[str, tuple[Callable[[], TreeSubject], str]]] = {
    "tree_verified_as_chain": (lambda: tree_subject(target=_ChainVerifiedTarget), "tree.per-node-state"),
    "tree_accepted_index_as_chain": (lambda: tree_subject(decoder=_AcceptedIndexAsChain), "tree.committed-state"),
    "tree_sibling_state_leak": (lambda: tree_subject(target=_SiblingStateLeak), "tree.per-node-state"),
    "tree_conv_from_previous_node": (lambda: tree_subject(target=_ConvFromPreviousNode), "tree.per-node-state"),
    "tree_commits_first_sibling": (lambda: tree_subject(decoder=_CommitsFirstSibling), "tree.committed-state"),
    "tree_bonus_from_wrong_row": (lambda: tree_subject(decoder=_BonusFromNextRow), "tree.greedy-lossless"),
}
"""Each member: its subject and the id of the check that must reject it at quick."""

TREE_CONTROLS: Final[dict[str, Callable[[], TreeSubject]]] = {
    "tree_checkpoint": lambda: tree_subject(rollback="checkpoint"),
    "tree_replay": lambda: tree_subject(rollback="replay"),
}
"""Correct variants every tree check must accept (a chain declared as a tree: the plan of width 1)."""
