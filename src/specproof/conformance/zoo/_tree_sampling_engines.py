"""Sampled tree engines (docs/contract.md, "Sampled trees"): the reference tree decoder with its sampled rule
broken once each, and a correct tree engine that samples by another rule.

- a scheme that accepts two siblings' tokens: it goes on testing the siblings after one is kept, and the last
  kept one wins (mass moves from the first child to later ones);
- a scheme that does not update the residual after a rejected sibling: each sibling is tested against ``p``
  itself, and the fallback draw is from ``p`` (too much mass on the children);
- correct, differently: traversal by sample-and-match (the target samples a token at the node from ``p`` and
  descends into the first child carrying it; lossless for any tree, whatever its ``q``).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from specproof.conformance.zoo._tree_engines import TreeZooEngine
from specproof.contract.tree import TreeDraft
from specproof.engine import TreeSpecDecoder

__all__ = ["TREE_SAMPLING_MEMBERS", "TreeMatchSamplingEngine"]


def _draw(row: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.choice(len(row), p=row / row.sum()))


def _children(tree: TreeDraft) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, parent in enumerate(tree.parents):
        out[parent + 1].append(i)
    return out


class _KeepsLastAcceptedSibling(TreeSpecDecoder):
    """Tests every sibling (the residual updated after each rejection); the last one kept wins."""

    def _sampled_path(
        self, tree: TreeDraft, q: np.ndarray, p: np.ndarray, rng: np.random.Generator
    ) -> tuple[tuple[int, ...], int]:
        children, node, path = _children(tree), -1, list[int]()
        while True:
            row, kept = p[node + 1], None
            for child in children[node + 1]:
                x = tree.tokens[child]
                if rng.random() * q[child][x] < row[x]:
                    kept = child  # no break: a later sibling kept too overrides this one
                    continue
                residual = np.maximum(row - q[child], 0.0)
                row = residual / residual.sum() if residual.sum() > 0 else row
            if kept is None:
                return tuple(path), _draw(row, rng)
            path.append(kept)
            node = kept


class _StaleResidual(TreeSpecDecoder):
    """Tests each sibling against ``p`` itself: a rejection does not update the residual."""

    def _sampled_path(
        self, tree: TreeDraft, q: np.ndarray, p: np.ndarray, rng: np.random.Generator
    ) -> tuple[tuple[int, ...], int]:
        children, node, path = _children(tree), -1, list[int]()
        while True:
            row, kept = p[node + 1], None
            for child in children[node + 1]:
                x = tree.tokens[child]
                if rng.random() * q[child][x] < row[x]:
                    kept = child
                    break
            if kept is None:
                return tuple(path), _draw(row, rng)
            path.append(kept)
            node = kept


class _MatchTraversal(TreeSpecDecoder):
    """Correct, differently: at each node the target samples from ``p`` and descends into the first child
    with that token; a token no child carries ends the round."""

    def _sampled_path(
        self, tree: TreeDraft, q: np.ndarray, p: np.ndarray, rng: np.random.Generator
    ) -> tuple[tuple[int, ...], int]:
        children, node, path = _children(tree), -1, list[int]()
        while True:
            token = _draw(p[node + 1], rng)
            node = next((c for c in children[node + 1] if tree.tokens[c] == token), -2)
            if node == -2:
                return tuple(path), token
            path.append(node)


class TreeSampledTwoSiblings(TreeZooEngine):
    """A sampled tree scheme that accepts two siblings' tokens: after a sibling is kept it goes on testing the
    others, and a later one kept replaces it."""

    tree_decoder_class = _KeepsLastAcceptedSibling


class TreeSampledStaleResidual(TreeZooEngine):
    """A sampled tree scheme that does not update the residual after a rejected sibling."""

    tree_decoder_class = _StaleResidual


class TreeMatchSamplingEngine(TreeZooEngine):
    """Correct, differently: sampled trees verified by sample-and-match traversal."""

    tree_decoder_class = _MatchTraversal


TREE_SAMPLING_MEMBERS: Final[dict[str, type[TreeZooEngine]]] = {
    "tree_sampled_two_siblings": TreeSampledTwoSiblings,
    "tree_sampled_stale_residual": TreeSampledStaleResidual,
}
"""The sampled tree zoo: member name -> engine class (claimed by ``tree.sampled-distribution``)."""
