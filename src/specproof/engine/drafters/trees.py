"""Tree drafters (docs/contract.md, "Trees"): top-k token trees from a draft model or a feature head, and
several prompt-lookup continuations merged into one tree.

A tree drafter has ``propose_tree(context, *, max_nodes, max_depth)`` and returns a ``TreeDraft`` with at
most ``max_nodes`` nodes, no root path longer than ``max_depth``, parents before children. It keeps
``propose(context, k)``, its chain drafter's proposal, so it also serves a chain engine.

Shapes (``TreeShape``, read by ``parse_tree_shape``):

- **static** (``"2x2x2"``, ``"4-2-1"``): ``branching[d]`` children under every node of level ``d`` (the
  roots: ``branching[0]`` of them), the top-``b`` tokens of the node's row, in level order and within a
  level in parent order then rank; a round's budget cuts the tree in that order (deepest levels first lost).
- **dynamic** (``"dynamic:16"``, ``"dynamic:16,k=4"``): EAGLE-2's confidence tree. A node's score is the
  product of the drafter's probabilities along its root path; the tree is the ``budget`` best-scored nodes
  with the top-``k`` children of every node as candidates. A child never scores above its parent, so
  best-first expansion (a heap) finds them with parents first, computing the rows of the chosen nodes only.

Ranks: the row's tokens by logit, descending, the lower id first among equals, so the first child is the
chain drafter's argmax and the all-ones static shape (``"1x1x1x1"``) proposes its chain exactly.

Rows (the ``_Rows`` classes): the row after ``context`` + a root path. For a draft model, the model is kept
on one path beyond the context at a time (a snapshot after each of its tokens): a node on that path or one
token past it costs one one-token forward, another restores the deepest shared snapshot first; the model is
left at the context (the chain drafter's own rollback sees nothing new). For a feature head, each path
token's K/V slot and output hidden are kept the same way (the head's slots past the accepted context are
overwritten by its next call, as its chain's are; ``rollback="replay"`` puts them back).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampled_tree import SampledTreeDraft
from specproof.contract.sampling import SamplingParams
from specproof.contract.tree import MAX_TREE_DEPTH, MAX_TREE_NODES, TreeDraft
from specproof.contract.validation import int_at_least
from specproof.engine.drafters._sampled_trees import (
    TreeRows,
    TreeSampler,
    build_sampled_tree,
    check_sampling_request,
)
from specproof.engine.drafters.heads import HeadDrafter
from specproof.engine.drafters.model import ModelDrafter
from specproof.engine.drafters.ngram import NgramDrafter

__all__ = ["NgramTreeDrafter", "TopKTreeDrafter", "TreeShape", "parse_tree_shape"]

_F64 = np.float64
DEFAULT_DYNAMIC_K = 4


@attrs.frozen
class TreeShape:
    """A static shape (``branching``: children per node at each level) or a dynamic one (``budget`` nodes,
    the top-``top_k`` children of every node as candidates)."""

    branching: tuple[int, ...] = ()
    budget: int = 0
    top_k: int = DEFAULT_DYNAMIC_K

    def __attrs_post_init__(self) -> None:
        if bool(self.branching) == bool(self.budget):
            raise InvalidSettingError("TreeShape: give either branching (static) or budget (dynamic), not both")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.branching):
            raise InvalidSettingError(f"TreeShape: branching={self.branching!r} must be integers >= 1")
        if len(self.branching) > MAX_TREE_DEPTH:
            raise InvalidSettingError(f"TreeShape: {len(self.branching)} levels, more than {MAX_TREE_DEPTH}")
        if self.budget and not 1 <= self.budget <= MAX_TREE_NODES:
            raise InvalidSettingError(f"TreeShape: budget={self.budget} must be in [1, {MAX_TREE_NODES}]")
        if not 1 <= self.top_k <= MAX_TREE_NODES:
            raise InvalidSettingError(f"TreeShape: top_k={self.top_k} must be in [1, {MAX_TREE_NODES}]")

    @property
    def dynamic(self) -> bool:
        return not self.branching

    @property
    def nodes(self) -> int:
        """The most nodes the shape holds (before a round's budget cuts it)."""
        if self.dynamic:
            return self.budget
        total, level = 0, 1
        for b in self.branching:
            level *= b
            total += level
        return total

    @property
    def depth(self) -> int:
        """The deepest root path the shape holds (dynamic: no limit of its own, the round's)."""
        return len(self.branching) if self.branching else MAX_TREE_DEPTH

    def __str__(self) -> str:
        if self.dynamic:
            return f"dynamic:{self.budget}" + (f",k={self.top_k}" if self.top_k != DEFAULT_DYNAMIC_K else "")
        return "x".join(str(b) for b in self.branching)


def parse_tree_shape(text: str) -> TreeShape:
    """``"2x2x2"`` / ``"4-2-1"`` (static) or ``"dynamic:16"`` / ``"dynamic:16,k=4"``; else a clear error."""
    if not isinstance(text, str):
        raise InvalidSettingError(f"tree shape {text!r}: expected text such as 2x2x2, 4-2-1 or dynamic:16")
    raw = text.strip()
    dynamic = re.fullmatch(r"dynamic:(\d+)(?:,k=(\d+))?", raw)
    if dynamic:
        top_k = int(dynamic.group(2)) if dynamic.group(2) else DEFAULT_DYNAMIC_K
        return TreeShape(budget=int(dynamic.group(1)), top_k=top_k)
    if re.fullmatch(r"\d+([x-]\d+)*", raw):
        return TreeShape(branching=tuple(int(b) for b in re.split(r"[x-]", raw)))
    raise InvalidSettingError(
        f"tree shape {text!r}: expected levels such as 2x2x2 or 4-2-1, or dynamic:BUDGET[,k=TOP_K]"
    )


def _ranked(row: np.ndarray, count: int) -> list[tuple[int, float]]:
    """The ``count`` best tokens of ``row`` (logit descending, lower id first) with their log-probabilities."""
    z = np.asarray(row, dtype=_F64)
    order = np.argsort(-z, kind="stable")[:count]
    shifted = z - z.max()
    log_norm = float(np.log(np.exp(shifted).sum()))
    return [(int(t), float(shifted[t]) - log_norm) for t in order]


_Rows = TreeRows  # the drafter's next-token rows after the context and a root path of draft tokens


def _static_tree(rows: _Rows, shape: TreeShape, max_nodes: int, max_depth: int) -> TreeDraft:
    levels = shape.branching[:max_depth]
    tokens: list[int] = []
    parents: list[int] = []
    paths: list[tuple[int, ...]] = []
    frontier = [-1]  # the previous level's nodes (-1: the context)
    for width in levels:
        nxt = []
        for parent in frontier:
            if len(tokens) >= max_nodes:
                break
            base = paths[parent] if parent >= 0 else ()
            for token, _ in _ranked(rows.after(base), width)[: max_nodes - len(tokens)]:
                nxt.append(len(tokens))
                tokens.append(token)
                parents.append(parent)
                paths.append((*base, token))
        frontier = nxt
    return TreeDraft(tuple(tokens), tuple(parents))


def _dynamic_tree(rows: _Rows, shape: TreeShape, max_nodes: int, max_depth: int) -> TreeDraft:
    budget = min(shape.budget, max_nodes)
    tokens: list[int] = []
    parents: list[int] = []
    paths: list[tuple[int, ...]] = []
    # entries: (-score, order, parent, token, expand): a candidate node, or (expand) a node whose children
    # are not ranked yet, at its own score (no child scores above it: its row is computed only if needed)
    heap: list[tuple[float, int, int, int, bool]] = [(-0.0, 0, -1, -1, True)]
    order = 1
    while heap and len(tokens) < budget:
        neg, _, node, token, expand = heapq.heappop(heap)
        if expand:
            base = paths[node] if node >= 0 else ()
            for child, logp in _ranked(rows.after(base), shape.top_k):
                heapq.heappush(heap, (neg - logp, order, node, child, False))
                order += 1
            continue
        tokens.append(token)
        parents.append(node)
        paths.append((*(paths[node] if node >= 0 else ()), token))
        if len(paths[-1]) < max_depth:
            heapq.heappush(heap, (neg, order, len(tokens) - 1, -1, True))
            order += 1
    return TreeDraft(tuple(tokens), tuple(parents))


def build_tree(rows: _Rows, shape: TreeShape, *, max_nodes: int, max_depth: int) -> TreeDraft:
    """The tree of ``shape`` over ``rows`` within ``max_nodes`` and ``max_depth``."""
    if max_nodes <= 0 or max_depth <= 0:
        return TreeDraft((), ())
    try:
        if shape.dynamic:
            return _dynamic_tree(rows, shape, max_nodes, max_depth)
        return _static_tree(rows, shape, max_nodes, max_depth)
    finally:
        rows.close()


class _ModelRows:
    """Rows of a ``ModelDrafter``'s model at the context it caught up on (see the module docstring)."""

    def __init__(self, drafter: ModelDrafter, context: Sequence[int]) -> None:
        drafter._catch_up(context)
        assert drafter._row is not None
        self._drafter = drafter
        self._model = drafter.model
        self._anchor = self._model.snapshot()
        self._root = drafter._row
        self._held: list[tuple[int, object, np.ndarray]] = []  # (token, snapshot after it, row after it)

    def after(self, path: tuple[int, ...]) -> np.ndarray:
        held = self._held
        shared = _shared_length(held, path)
        if shared == len(path):
            return held[shared - 1][2] if shared else self._root
        if shared < len(held):
            del held[shared:]
            self._model.restore(held[-1][1] if held else self._anchor)
        for token in path[shared:]:
            row = np.asarray(self._model.forward([token]))[-1]
            held.append((token, self._model.snapshot(), row))
            self._drafter.forwards += 1
            self._drafter.draft_forwards += 1
            self._drafter.tokens_fed += 1
        return held[-1][2]

    def close(self) -> None:
        if self._held:
            self._model.restore(self._anchor)
            self._held = []


class _HeadRows:
    """Rows of a ``HeadDrafter``'s head after the context's last real position (see the module docstring)."""

    def __init__(
        self, drafter: HeadDrafter, context: Sequence[int], features: Mapping[int, np.ndarray] | None, depth: int
    ) -> None:
        self._drafter = drafter
        self._head = drafter.head
        self._last = drafter._catch_up(context, features)
        self._root = self._head.logits(self._last)[0]
        self._pos = len(context) - 1  # the first draft position's head slot
        self._held: list[tuple[int, np.ndarray, np.ndarray]] = []  # (token, output hidden, row)
        self._saved: tuple[np.ndarray, np.ndarray] | None = None
        if drafter.rollback == "replay":
            cache = drafter._cache
            end = self._pos + max(depth - 1, 0)  # the slots of the paths whose rows are asked for
            self._saved = (cache[0][:, self._pos : end].copy(), cache[1][:, self._pos : end].copy())

    def after(self, path: tuple[int, ...]) -> np.ndarray:
        held = self._held
        shared = _shared_length(held, path)
        if shared == len(path):
            return held[shared - 1][2] if shared else self._root
        del held[shared:]  # slots past the shared prefix are rewritten below
        for token in path[shared:]:
            hidden = held[-1][1] if held else self._last
            pos = self._pos + len(held)
            out = self._head.step(self._drafter._cache, pos, [token], hidden[None, :])[0]
            held.append((token, out, self._head.logits(out)[0]))
            self._drafter.chain_steps += 1
        return held[-1][2]

    def close(self) -> None:
        if self._saved is not None:
            end = self._pos + self._saved[0].shape[1]
            self._drafter._cache[0][:, self._pos : end] = self._saved[0]
            self._drafter._cache[1][:, self._pos : end] = self._saved[1]
            self._saved = None


class TopKTreeDrafter:
    """Top-k trees of ``shape`` from a draft model (``ModelDrafter``) or a feature head (``HeadDrafter``).

    ``propose(context, k)`` is the wrapped drafter's chain; ``propose_tree(context, *, max_nodes, max_depth,
    features=None)`` the tree (a head drafter takes the engine's features as its ``propose`` does).
    """

    model_rows: type[_ModelRows] = _ModelRows  # the zoo overrides it to plant a rollback bug
    tree_sampler: type[TreeSampler] = TreeSampler  # a test overrides it to plant a wrongly declared q

    def __init__(self, drafter: ModelDrafter | HeadDrafter, shape: TreeShape | str) -> None:
        if not isinstance(drafter, (ModelDrafter, HeadDrafter)):
            raise InvalidSettingError(
                f"TopKTreeDrafter: drafter must be a ModelDrafter or a HeadDrafter, got {type(drafter).__name__}"
            )
        self.drafter = drafter
        self.shape = parse_tree_shape(shape) if isinstance(shape, str) else shape
        if not isinstance(self.shape, TreeShape):
            raise InvalidSettingError(f"TopKTreeDrafter: shape={shape!r} is not a TreeShape or its text")
        self.vocab_size = drafter.vocab_size
        self.name = f"specproof.TopKTreeDrafter({self.shape}, {getattr(drafter, 'name', type(drafter).__name__)})"
        if isinstance(drafter, HeadDrafter):
            self.feature_layers = drafter.feature_layers
            self.feature_target_spec = drafter.feature_target_spec

    def __repr__(self) -> str:
        return self.name

    def reset(self) -> None:
        self.drafter.reset()

    def propose(self, context: Sequence[int], k: int, **kwargs: Any) -> list[int]:
        return list(self.drafter.propose(context, k, **kwargs))

    def propose_tree(
        self,
        context: Sequence[int],
        *,
        max_nodes: int,
        max_depth: int,
        features: Mapping[int, np.ndarray] | None = None,
    ) -> TreeDraft:
        rows = self._rows(context, max_nodes, max_depth, features)
        if rows is None:
            return TreeDraft((), ())
        return build_tree(rows[0], self.shape, max_nodes=rows[1], max_depth=rows[2])

    def propose_tree_sampled(
        self,
        context: Sequence[int],
        *,
        max_nodes: int,
        max_depth: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        features: Mapping[int, np.ndarray] | None = None,
    ) -> SampledTreeDraft:
        """The tree of the shape with each node's children drawn from the drafter's ``q`` at ``sampling`` (one
        uniform of ``rng`` each, siblings without replacement) and each node's declared row
        (``_sampled_trees``; docs/contract.md, "Sampled trees")."""
        check_sampling_request(sampling, rng)
        rows = self._rows(context, max_nodes, max_depth, features)
        if rows is None:
            return SampledTreeDraft(TreeDraft((), ()), np.zeros((0, self.vocab_size)))
        return build_sampled_tree(
            rows[0],
            self.shape,
            max_nodes=rows[1],
            max_depth=rows[2],
            vocab_size=self.vocab_size,
            sampling=sampling,
            rng=rng,
            sampler=self.tree_sampler,
        )

    def _rows(
        self, context: Sequence[int], max_nodes: int, max_depth: int, features: Mapping[int, np.ndarray] | None
    ) -> tuple[_Rows, int, int] | None:
        """The drafter's rows at ``context`` and the round's budget it can hold; None: an empty tree."""
        max_nodes = min(int_at_least(max_nodes, name="max_nodes", minimum=0, where="propose_tree"), MAX_TREE_NODES)
        max_depth = min(int_at_least(max_depth, name="max_depth", minimum=0, where="propose_tree"), MAX_TREE_DEPTH)
        drafter = self.drafter
        n = len(context)
        if isinstance(drafter, ModelDrafter):
            if n == 0 or n > drafter.max_context:
                return None
            max_depth = min(max_depth, drafter.max_context - n + 1)  # the model holds context + path[:-1]
            if not (max_nodes and max_depth):
                return None
            drafter.proposals += 1
            return self.model_rows(drafter, context), max_nodes, max_depth
        if n < 2 or n - 1 > drafter.max_context:
            return None  # no feature yet, or past the head's capacity
        max_depth = min(max_depth, drafter.max_context - (n - 1) + 1)  # as its chain: slots for path[:-1]
        if not (max_nodes and max_depth):
            return None
        drafter.proposals += 1
        return _HeadRows(drafter, context, features, max_depth), max_nodes, max_depth


class NgramTreeDrafter:
    """Prompt lookup as a tree: up to ``width`` continuations of the context's suffix, merged where they agree.

    The first continuation is ``NgramDrafter(min_n, max_n).propose``'s (the most recent match of the
    longest suffix, extended by its period), so the tree's first root path is the chain drafter's draft.
    Then the other earlier occurrences, of the longest suffix first and of shorter ones after, most
    recent first, each continuation cut at the end of the context and at ``max_depth``; a continuation
    shares the nodes of the ones before it as far as they agree and branches where it differs. The
    budget cuts the last continuation short. A context whose suffix never occurred proposes the empty tree.
    """

    def __init__(self, min_n: int = 1, max_n: int = 3, *, width: int = 4) -> None:
        self._chain = NgramDrafter(min_n, max_n)
        self.min_n, self.max_n = min_n, max_n
        self.width = int_at_least(width, name="width", minimum=1, where="NgramTreeDrafter")
        self.name = f"specproof.NgramTreeDrafter(min_n={min_n}, max_n={max_n}, width={width})"

    def __repr__(self) -> str:
        return self.name

    def reset(self) -> None:
        self._chain.reset()

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return self._chain.propose(context, k)

    def propose_tree(self, context: Sequence[int], *, max_nodes: int, max_depth: int) -> TreeDraft:
        max_nodes = min(int_at_least(max_nodes, name="max_nodes", minimum=0, where="propose_tree"), MAX_TREE_NODES)
        max_depth = min(int_at_least(max_depth, name="max_depth", minimum=0, where="propose_tree"), MAX_TREE_DEPTH)
        if not (max_nodes and max_depth):
            return TreeDraft((), ())
        tokens = [int(t) for t in context]
        first = self._chain.propose(tokens, max_depth)
        if not first:
            return TreeDraft((), ())
        continuations = [first]
        size = len(tokens)
        seen: set[int] = set()
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            suffix = tokens[size - n :]
            for start in range(size - n - 1, -1, -1):  # most recent first; start + n < size: a token follows
                if len(continuations) >= self.width:
                    break
                if start + n not in seen and tokens[start : start + n] == suffix:
                    seen.add(start + n)
                    continuations.append(tokens[start + n : start + n + max_depth])
        return _merge(continuations, max_nodes)


def _merge(continuations: Sequence[Sequence[int]], max_nodes: int) -> TreeDraft:
    """The continuations as one tree (a trie in their order), cut at ``max_nodes`` nodes."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for seq in continuations:
        parent = -1
        for token in seq:
            node = child.get((parent, token))
            if node is None:
                if len(tokens) >= max_nodes:
                    break
                node = len(tokens)
                tokens.append(token)
                parents.append(parent)
                child[(parent, token)] = node
            parent = node
    return TreeDraft(tuple(tokens), tuple(parents))


def _shared_length(held: Sequence[tuple[Any, ...]], path: tuple[int, ...]) -> int:
    """How many leading tokens of ``path`` the held root path (``(token, ...)`` per step) already has."""
    shared = 0
    while shared < min(len(held), len(path)) and held[shared][0] == path[shared]:
        shared += 1
    return shared
