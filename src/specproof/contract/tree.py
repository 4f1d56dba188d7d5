"""Tree drafts (docs/contract.md, "Trees"): the record, its one validation, and the greedy tree rule.

A tree draft is ``tokens`` with ``parents``: ``parents[i]`` is the index of node ``i``'s parent, or
``-1`` when node ``i`` is a child of the context (the pending token). Parents come before children
(``parents[i] < i``), so the flattened order is a topological order. A chain is the tree in which
node ``i``'s parent is ``i - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs
import numpy as np

from specproof.contract.errors import DrafterContractError

__all__ = [
    "MAX_TREE_DEPTH",
    "MAX_TREE_NODES",
    "TreeDraft",
    "TreeVerdict",
    "chain_tree",
    "greedy_tree_accept",
]

MAX_TREE_NODES: Final = 64
"""The most nodes a tree draft may hold (EAGLE-3's default budget is 60)."""
MAX_TREE_DEPTH: Final = 16
"""The deepest a tree draft may be: at most this many draft tokens on one root path."""


def _int_tuple(value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)):
        raise DrafterContractError(f"a tree draft needs a sequence of ints, got {type(value).__name__}")
    try:
        items = list(value)
    except TypeError:
        raise DrafterContractError(f"a tree draft needs a sequence of ints, got {type(value).__name__}") from None
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise DrafterContractError(f"tree draft item [{i}]={item!r} is not an int")
    return tuple(int(item) for item in items)


@attrs.frozen
class TreeDraft:
    """A token tree: ``tokens[i]`` hangs under node ``parents[i]`` (``-1``: under the context).

    Validated on construction, in one place: equal lengths, ``-1 <= parents[i] < i`` (parents
    before children), at most ``MAX_TREE_NODES`` nodes and ``MAX_TREE_DEPTH`` levels. Siblings may
    repeat a token (their subtrees differ). Token ids are checked against a vocabulary by ``check(vocab_size)``.
    """

    tokens: tuple[int, ...] = attrs.field(converter=_int_tuple)
    parents: tuple[int, ...] = attrs.field(converter=_int_tuple)
    depths: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n:
            raise DrafterContractError(f"tree draft: {n} tokens but {len(self.parents)} parents")
        if n > MAX_TREE_NODES:
            raise DrafterContractError(f"tree draft: {n} nodes, more than MAX_TREE_NODES={MAX_TREE_NODES}")
        depths: list[int] = []
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise DrafterContractError(
                    f"tree draft: parents[{i}]={parent} must be -1 (the context) or an earlier node in [0, {i})"
                )
            depth = 1 if parent < 0 else depths[parent] + 1
            if depth > MAX_TREE_DEPTH:
                raise DrafterContractError(
                    f"tree draft: node {i} is at depth {depth} > MAX_TREE_DEPTH={MAX_TREE_DEPTH}"
                )
            depths.append(depth)
        object.__setattr__(self, "depths", tuple(depths))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """The number of draft tokens on the longest root path (0 for the empty tree)."""
        return max(self.depths, default=0)

    @property
    def is_chain(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    def children(self, node: int) -> list[int]:
        """The children of ``node`` (``-1``: the roots), in flattened order."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def path(self, node: int) -> list[int]:
        """The nodes from a root down to ``node`` (``[]`` for ``-1``)."""
        out: list[int] = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def check(self, vocab_size: int) -> TreeDraft:
        """This tree, or ``DrafterContractError`` naming the first token outside ``[0, vocab_size)``."""
        for i, tok in enumerate(self.tokens):
            if not 0 <= tok < vocab_size:
                raise DrafterContractError(f"tree draft: tokens[{i}]={tok} is outside [0, {vocab_size})")
        return self


def chain_tree(tokens: Sequence[int]) -> TreeDraft:
    """The chain ``tokens`` as a tree: node ``i``'s parent is ``i - 1``."""
    return TreeDraft(tuple(tokens), tuple(range(-1, len(tokens) - 1)))


@attrs.frozen
class TreeVerdict:
    """The greedy rule's result: ``path`` (the accepted nodes, root first), ``accepted`` (their tokens
    plus the bonus token, the target's argmax at the path's last node) and ``argmax`` (the target's
    greedy token after the context, ``argmax[0]``, and after each node ``i``, ``argmax[i + 1]``)."""

    path: tuple[int, ...]
    accepted: tuple[int, ...]
    argmax: tuple[int, ...]


def greedy_tree_accept(tree: TreeDraft, logits: np.ndarray) -> TreeVerdict:
    """The lossless greedy tree rule over ``logits`` ``[1 + len(tree), vocab]`` (row 0: the pending
    token; row ``i + 1``: node ``i``): a node matches when its token equals the target's argmax at its
    parent and its parent matches (a root: the argmax at the pending token). The accepted path is the
    deepest matching node's root path (ties: the first in flattened order), plus the bonus token,
    the argmax at its last node. Every matching node's path is plain greedy decoding, so the accepted
    tokens are exactly greedy decoding's next ``len(path) + 1`` tokens.
    """
    argmax = tuple(int(i) for i in np.argmax(logits, axis=1))  # first maximum: lowest index wins a tie
    matched = [False] * len(tree)
    best, best_depth = -1, 0
    for i, parent in enumerate(tree.parents):
        if (parent < 0 or matched[parent]) and tree.tokens[i] == argmax[parent + 1]:
            matched[i] = True
            if tree.depths[i] > best_depth:
                best, best_depth = i, tree.depths[i]
    path = tuple(tree.path(best))
    accepted = (*(tree.tokens[i] for i in path), argmax[best + 1])
    return TreeVerdict(path=path, accepted=accepted, argmax=argmax)
