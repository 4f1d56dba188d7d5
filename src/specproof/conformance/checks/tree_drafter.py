"""``drafter.tree-well-formed`` and ``drafter.tree-deterministic`` (docs/contract.md, "Tree drafters"): a tree
drafter's trees, called as a decoder calls it.

The drafter is asked for a tree at growing prefixes of one context, each call with its own node budget
and depth, and every answer is judged with the suite's own reading of the contract (not the engine's
``TreeDraft``, which the subject may share): a ``TreeDraft``-like record or a ``(tokens, parents)`` pair of
equal lengths, each parent ``-1`` or an earlier node, token ids ints in ``[0, vocab_size)``, at most
``max_nodes`` nodes and no root path longer than ``max_depth``. ``drafter.tree-deterministic`` compares every
call's tree with a fresh drafter's on the same prefix and budget: a tree depends on nothing else (a drafter
whose model or head is left on the last branch it expanded proposes from the wrong state next time).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import TYPE_CHECKING, Any

from specproof.contract import Violation

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["check_tree_deterministic", "check_tree_well_formed", "tree_problem"]


def _ints(value: Any) -> list[Any] | None:
    if isinstance(value, (str, bytes)) or value is None:
        return None
    try:
        return list(value)
    except TypeError:
        return None


def tree_problem(answer: Any, *, max_nodes: int, max_depth: int, vocab_size: int) -> str | None:
    """What is wrong with ``answer`` as a tree for a call of ``max_nodes`` and ``max_depth``, or None."""
    if hasattr(answer, "tokens") and hasattr(answer, "parents"):
        tokens, parents = _ints(answer.tokens), _ints(answer.parents)
    elif isinstance(answer, tuple) and len(answer) == 2:
        tokens, parents = _ints(answer[0]), _ints(answer[1])
    else:
        return f"returned {type(answer).__name__}, not a tree (a TreeDraft or a (tokens, parents) pair)"
    if tokens is None or parents is None:
        return "the tree's tokens and parents must be sequences of ints"
    if len(tokens) != len(parents):
        return f"{len(tokens)} tokens but {len(parents)} parents"
    depth_of: list[int] = []
    for i, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
        for what, value in (("tokens", token), ("parents", parent)):
            if isinstance(value, bool) or not isinstance(value, Integral):
                return f"{what}[{i}]={value!r} is not an int"
        if not 0 <= int(token) < vocab_size:
            return f"tokens[{i}]={token} is outside [0, {vocab_size})"
        if not -1 <= int(parent) < i:
            return f"parents[{i}]={parent} is not -1 (the context) nor an earlier node: a child before its parent"
        depth_of.append(1 if parent < 0 else depth_of[int(parent)] + 1)
    if len(tokens) > max_nodes:
        return f"{len(tokens)} nodes, more than the call's max_nodes={max_nodes}"
    if depth_of and max(depth_of) > max_depth:
        return f"a root path of {max(depth_of)} tokens, deeper than the call's max_depth={max_depth}"
    return None


def check_tree_well_formed(
    inv: Invariant,
    drafter: Any,
    context: Sequence[int],
    calls: Sequence[tuple[int, int, int]],
    *,
    vocab_size: int,
) -> tuple[list[Violation], int, str]:
    """``calls``: ``(prefix_length, max_nodes, max_depth)`` in the order made. Returns the violations, the
    calls whose tree had a node (exercised) and, when none had, why."""
    out: list[Violation] = []
    exercised = 0
    for index, (length, max_nodes, max_depth) in enumerate(calls):
        prefix = list(context[:length])
        answer = drafter.propose_tree(prefix, max_nodes=max_nodes, max_depth=max_depth)
        problem = tree_problem(answer, max_nodes=max_nodes, max_depth=max_depth, vocab_size=vocab_size)
        example = {"context": prefix, "max_nodes": max_nodes, "max_depth": max_depth, "call": index}
        if problem is not None:
            out.append(inv.violation(f"call {index}: {problem}", example=example))
            break
        exercised += bool(_ints(answer.tokens if hasattr(answer, "tokens") else answer[0]))
    return out, exercised, "" if exercised or out else "the drafter proposed no tree node at any call"


def _as_pair(answer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if hasattr(answer, "tokens") and hasattr(answer, "parents"):
        return tuple(int(t) for t in answer.tokens), tuple(int(p) for p in answer.parents)
    return tuple(int(t) for t in answer[0]), tuple(int(p) for p in answer[1])


def check_tree_deterministic(
    inv: Invariant, make: Any, context: Sequence[int], calls: Sequence[tuple[int, int, int]]
) -> tuple[list[Violation], int, str]:
    """One drafter called along ``calls`` (``(prefix_length, max_nodes, max_depth)``), each answer against a
    fresh drafter's (``make()``) on the same call. Returns the violations, the calls compared where either
    tree had a node, and why none was compared."""
    drafter = make()
    compared = 0
    for index, (length, max_nodes, max_depth) in enumerate(calls):
        prefix = list(context[:length])
        got = _as_pair(drafter.propose_tree(prefix, max_nodes=max_nodes, max_depth=max_depth))
        want = _as_pair(make().propose_tree(list(prefix), max_nodes=max_nodes, max_depth=max_depth))
        if got != want:
            example = {"context": prefix, "max_nodes": max_nodes, "max_depth": max_depth, "call": index}
            explanation = f"call {index}: the tree differs from a fresh drafter's on the same context and budget"
            return [inv.violation(explanation, expected=list(want), actual=list(got), example=example)], 1, ""
        compared += bool(got[0] or want[0])
    return [], compared, "" if compared else "the drafter proposed no tree node at any call"
