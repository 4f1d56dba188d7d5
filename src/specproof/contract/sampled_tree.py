"""What a sampling tree drafter proposes (docs/contract.md, "Sampled trees"): a tree and each node's ``q``.

A tree drafter may have ``propose_tree_sampled(context, *, max_nodes, max_depth, sampling, rng)`` returning a
``SampledTreeDraft``; one without it is deterministic (each node's ``q`` is one-hot on its token). The sampled
tree rule is lossless when every node's token was drawn from its declared row given everything drawn before
it, nodes numbered in draw order (siblings drawn with replacement from one ``q``; or without replacement, the
``j``-th declaring ``q`` less siblings ``0..j-1``'s tokens, renormalized, as ``TopKTreeDrafter`` draws them).
"""

from __future__ import annotations

import attrs
import numpy as np

from specproof.contract.errors import DrafterContractError
from specproof.contract.tree import TreeDraft

__all__ = ["SampledTreeDraft", "one_hot_rows"]


@attrs.frozen
class SampledTreeDraft:
    """``tree`` and ``q``: ``q[i]`` is the distribution node ``i``'s token was drawn from (``[len(tree), vocab]``)."""

    tree: TreeDraft
    q: np.ndarray = attrs.field(eq=False, repr=False)

    def checked(self, vocab_size: int, *, who: str) -> np.ndarray:
        """``q`` as float64 rows, or ``DrafterContractError`` naming the first row that is not a distribution
        over the vocabulary with mass on its node's token."""
        q = np.asarray(self.q, dtype=np.float64)
        if q.shape != (len(self.tree), vocab_size):
            raise DrafterContractError(f"{who}: q has shape {q.shape}, expected {(len(self.tree), vocab_size)}")
        for i, token in enumerate(self.tree.tokens):
            row = q[i]
            if not np.isfinite(row).all() or (row < 0).any() or abs(row.sum() - 1.0) > 1e-6 or row[token] <= 0.0:
                raise DrafterContractError(
                    f"{who}: q[{i}] is not a distribution with mass on node {i}'s token {token} (sampled trees)"
                )
        return q


def one_hot_rows(tree: TreeDraft, vocab_size: int) -> np.ndarray:
    """A deterministic tree's ``q``: row ``i`` one-hot on node ``i``'s token."""
    q = np.zeros((len(tree), vocab_size))
    q[np.arange(len(tree)), list(tree.tokens)] = 1.0
    return q
