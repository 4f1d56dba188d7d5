"""Sampled top-k trees (docs/contract.md, "Sampled trees"): a tree drafter's children drawn from its own ``q``.

``TopKTreeDrafter.propose_tree_sampled`` builds the tree of its shape as ``propose_tree`` does, but each
node's children are drawn, not ranked: ``q`` is the drafter's row after the node's root path processed at the
request's sampling parameters (the engine's ``target_distribution``, as the chain's ``propose_sampled``), and
the siblings are drawn one after another **without replacement** (one uniform of the request's generator
each): sibling ``j``'s declared row is ``q`` with siblings ``0..j-1``'s tokens removed and renormalized, the
row it was drawn from. A node whose ``q`` has no mass left gets no more children.

What the engine's rule (recursive rejection sampling over siblings, ``engine._tree_sampling``) needs of these
rows: each node's token drawn from its declared row given everything drawn before it, nodes numbered in the
order they were drawn (so siblings are tried in the order they were drawn), and whether a node exists
decided before its token is drawn. Siblings drawn with replacement from one ``q`` (SpecInfer's multi-step
sampling) meet it with the same row for each; without replacement (no duplicate sibling, whose test would
always fail: the residual has no mass on a rejected token) meets it with the shrinking rows above.

Shapes: a **static** shape draws ``branching[d]`` children of every level-``d`` node, level by level, in
parent order. A **dynamic** shape keeps EAGLE-2's best-first budget but scores child slot ``j`` of a node by
the node's score times the ``j``-th largest probability of its ``q`` (not the drawn token's probability:
keeping a node for the token it drew would bias the token). Slot ``j`` never outscores slot ``j - 1``, so the
heap draws a node's siblings in slot order, after their parent.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Protocol

import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampled_tree import SampledTreeDraft
from specproof.contract.sampling import SamplingParams
from specproof.contract.tree import TreeDraft
from specproof.engine._sampling import draw, target_distribution

if TYPE_CHECKING:  # pragma: no cover
    from specproof.engine.drafters.trees import TreeShape

__all__ = ["TreeRows", "TreeSampler", "build_sampled_tree", "check_sampling_request", "without"]


class TreeRows(Protocol):
    """The drafter's next-token logits rows after the context and a root path of draft tokens."""

    def after(self, path: tuple[int, ...]) -> np.ndarray: ...

    def close(self) -> None: ...


def check_sampling_request(sampling: object, rng: object) -> None:
    """A clear error unless ``sampling`` is a ``SamplingParams`` and ``rng`` a numpy ``Generator``."""
    if not isinstance(sampling, SamplingParams):
        raise InvalidSettingError(f"propose_tree_sampled: sampling={sampling!r} must be a SamplingParams")
    if not isinstance(rng, np.random.Generator):
        raise InvalidSettingError(f"propose_tree_sampled: rng={rng!r} must be a numpy.random.Generator")


def without(q: np.ndarray, drawn: list[int]) -> np.ndarray | None:
    """``q`` with the ``drawn`` tokens removed, renormalized (None when no mass is left)."""
    rest = np.array(q, dtype=np.float64, copy=True)
    rest[drawn] = 0.0
    total = float(rest.sum())
    return rest / total if total > 0.0 else None


class TreeSampler:
    """The tree being drawn: its nodes, each node's declared row, and each parent's ``q`` and drawn children
    (a test subclasses ``pick`` to plant a drafter that declares a row it did not draw from)."""

    def __init__(self, rows: TreeRows, sampling: SamplingParams, rng: np.random.Generator) -> None:
        self.rows, self.sampling, self.rng = rows, sampling, rng
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.paths: list[tuple[int, ...]] = []
        self.declared: list[np.ndarray] = []
        self._q: dict[int, np.ndarray] = {}  # parent node (-1: the context) -> its q
        self._drawn: dict[int, list[int]] = {}  # parent node -> its children's tokens, in draw order

    def q(self, node: int) -> np.ndarray:
        if node not in self._q:
            path = self.paths[node] if node >= 0 else ()
            self._q[node] = target_distribution(np.asarray(self.rows.after(path), dtype=np.float64), self.sampling)
            self._drawn[node] = []
        return self._q[node]

    def add_child(self, node: int) -> bool:
        """Draw ``node``'s next child without replacement; False when its ``q`` has no mass left."""
        row = without(self.q(node), self._drawn[node])
        if row is None:
            return False
        token = self.pick(row)
        self._drawn[node].append(token)
        self.tokens.append(token)
        self.parents.append(node)
        self.paths.append((*(self.paths[node] if node >= 0 else ()), token))
        self.declared.append(row)
        return True

    def pick(self, row: np.ndarray) -> int:
        """The child's token: one draw from its declared row (one uniform of the request's generator)."""
        return draw(row, self.rng)

    def result(self, vocab_size: int) -> SampledTreeDraft:
        q = np.stack(self.declared) if self.declared else np.zeros((0, vocab_size))
        return SampledTreeDraft(TreeDraft(tuple(self.tokens), tuple(self.parents)), q)


def _static(s: TreeSampler, branching: tuple[int, ...], max_nodes: int) -> None:
    frontier = [-1]
    for width in branching:
        nxt: list[int] = []
        for parent in frontier:
            for _ in range(width):
                if len(s.tokens) >= max_nodes or not s.add_child(parent):
                    break
                nxt.append(len(s.tokens) - 1)
        frontier = nxt


def _dynamic(s: TreeSampler, shape: TreeShape, max_nodes: int, max_depth: int) -> None:
    budget = min(shape.budget, max_nodes)
    # entries (-score, order, node, slot): slot -1 ranks the node's q into child slots, slot j >= 0 draws the
    # node's j-th child (its score: the node's times the j-th largest probability of its q)
    heap: list[tuple[float, int, int, int]] = [(-0.0, 0, -1, -1)]
    order = 1
    while heap and len(s.tokens) < budget:
        neg, _, node, slot = heapq.heappop(heap)
        if slot < 0:
            best = np.sort(s.q(node))[::-1][: shape.top_k]
            for j, prob in enumerate(best):
                if prob <= 0.0:
                    break
                heapq.heappush(heap, (neg - math.log(float(prob)), order, node, j))
                order += 1
            continue
        if not s.add_child(node):
            continue
        if len(s.paths[-1]) < max_depth:
            heapq.heappush(heap, (neg, order, len(s.tokens) - 1, -1))
            order += 1


def build_sampled_tree(
    rows: TreeRows,
    shape: TreeShape,
    *,
    max_nodes: int,
    max_depth: int,
    vocab_size: int,
    sampling: SamplingParams,
    rng: np.random.Generator,
    sampler: type[TreeSampler] = TreeSampler,
) -> SampledTreeDraft:
    """The sampled tree of ``shape`` over ``rows`` within ``max_nodes`` and ``max_depth``, each node's row."""
    s = sampler(rows, sampling, rng)
    try:
        if max_nodes > 0 and max_depth > 0:
            if shape.dynamic:
                _dynamic(s, shape, max_nodes, max_depth)
            else:
                _static(s, shape.branching[:max_depth], max_nodes)
    finally:
        rows.close()
    return s.result(vocab_size)
