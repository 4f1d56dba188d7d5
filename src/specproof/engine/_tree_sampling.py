"""The reference engine's sampled tree rule: recursive rejection sampling over siblings (docs/contract.md,
"Trees", "Sampled trees").

The engine's own implementation, written apart from the checks' oracle (``specproof.contract.sampling``),
as ``_sampling`` is. From the verified tree's root (the pending token) down: at a node, try its children in
flattened order against the current target row ``r`` (the node's ``p`` at first): child ``x`` with declared
proposal row ``q`` is kept with probability ``min(1, r(x) / q(x))``; on a rejection ``r`` becomes the
normalized residual ``max(r - q, 0)`` and the next sibling is tried. A kept child becomes the node; when every
child is rejected (or the node has none) the round's last token is a draw from ``r``. Lossless when each
node's token was drawn from its declared ``q`` given everything drawn before it, nodes numbered in draw
order: siblings i.i.d. from one ``q``, or without replacement each declaring ``q`` less the earlier
siblings' tokens, renormalized, or a deterministic tree (one-hot rows, the tree a function of the context).

Random numbers in a fixed order from the request's generator: one uniform per child tried, one per draw.
"""

from __future__ import annotations

import numpy as np

from specproof.contract.tree import TreeDraft
from specproof.engine._sampling import draw

__all__ = ["sampled_tree_accept"]


def sampled_tree_accept(
    tree: TreeDraft, q: np.ndarray, p: np.ndarray, rng: np.random.Generator
) -> tuple[tuple[int, ...], int]:
    """``(path, token)``: the kept root path of ``tree`` and the round's last token.

    ``p``: ``[1 + len(tree), vocab]``, row 0 the pending token's distribution, row ``i + 1`` node ``i``'s;
    ``q``: ``[len(tree), vocab]``, node ``i``'s proposal row (the distribution its token was drawn from).
    """
    children: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, parent in enumerate(tree.parents):
        children[parent + 1].append(i)
    node, path = -1, list[int]()
    while True:
        row = p[node + 1]
        kept = None
        for child in children[node + 1]:
            x, proposal = tree.tokens[child], q[child]
            if proposal[x] > 0.0 and rng.random() * proposal[x] < row[x]:
                kept = child
                break
            residual = np.maximum(row - proposal, 0.0)
            # q covers r up to rounding: the rejection had probability ~0, and r is still the law to draw from
            row = residual / residual.sum() if residual.sum() > 0.0 else row
        if kept is None:
            return tuple(path), draw(row, rng)
        path.append(kept)
        node = kept
