"""Can a function verify a token tree in one forward? (``bundle inspect``, JSON ``tree``; docs/coreml.md, "Trees").

A tree's siblings share a position, so a chain-shaped function (tokens at consecutive positions under a
causal mask) verifies one root path per call. One forward over a whole tree needs the tree's shape as an
input: parent indices, or a tree attention mask. On a hybrid model a mask is not enough: each branch's
conv window and recurrent state continue from its parent, which the function can follow only from
parent indices; and since the siblings' states differ, the function must return each node's state (and
KV rows) for the host to commit the winning path's. The verdict says which of these a function lacks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final, Protocol

import attrs

__all__ = ["TreeVerdict", "tree_rules", "tree_verdict"]

_PARENT_NAME: Final = re.compile(r"parent|retrieve", re.IGNORECASE)
_MASK_NAME: Final = re.compile(r"tree_?mask|attn_?mask|attention_?mask", re.IGNORECASE)
_KV_NAME: Final = re.compile(r"(key|value|kv|k_cache|v_cache|past)", re.IGNORECASE)
_INT_TYPES: Final = {"INT32", "INT16", "INT8", "UINT8", "UINT16", "INT64"}
_WHY: Final = (
    "a token tree's siblings share a position: a chain-shaped forward verifies one root path per call, so "
    "a tree of B leaves costs B forwards (docs/contract.md, Trees)"
)


class _Tensor(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def dims(self) -> tuple[object, ...]: ...


@attrs.frozen(kw_only=True)
class TreeVerdict:
    """Whether a function verifies a tree of ``nodes`` nodes in one forward, what was found, why it matters."""

    verifies_tree: bool
    detail: str
    why: str = ""
    nodes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"verifies_tree": self.verifies_tree, "nodes": self.nodes, "detail": self.detail, "why": self.why}


def _per_node(outputs: Sequence[_Tensor], nodes: int, match: Any) -> list[str]:
    """Outputs whose name ``match``es and that have a dimension of ``nodes`` (one row per node)."""
    return [o.name for o in outputs if match(o.name) and nodes in o.dims]


def tree_verdict(
    inputs: Sequence[_Tensor], outputs: Sequence[_Tensor], recurrent: Sequence[str], token: _Tensor | None
) -> TreeVerdict:
    """The verdict from the function's interface; ``recurrent``: its recurrent (non-KV) persistent states."""
    parents = [t for t in inputs if _PARENT_NAME.search(t.name) and t.dtype in _INT_TYPES]
    masks = [t for t in inputs if _MASK_NAME.search(t.name) and len(t.dims) >= 2]
    if not parents and not masks:
        return TreeVerdict(
            verifies_tree=False, detail="no parent-index or tree-mask input: one chain per forward", why=_WHY
        )
    if not parents:
        if recurrent:
            return TreeVerdict(
                verifies_tree=False,
                detail=f"a tree mask ({masks[0].name!r}) but no parent indices: attention can follow the tree, the "
                f"recurrent state ({', '.join(recurrent)}) cannot",
                why="each branch's conv window and recurrent state continue from its parent node, not from the node "
                "before it in the flattened order (docs/contract.md, Trees)",
            )
        return TreeVerdict(verifies_tree=True, detail=f"a tree mask {masks[0].name!r} and no recurrent state")
    parent = parents[0]
    size = parent.dims[-1] if parent.dims else None
    if not isinstance(size, int):
        return TreeVerdict(
            verifies_tree=False,
            detail=f"parent indices {parent.name!r} of no fixed node count {list(parent.dims)}",
            why="the tree function's node count is its fixed size",
        )
    return _with_parents(outputs, recurrent, token, parent.name, size)


def _with_parents(
    outputs: Sequence[_Tensor], recurrent: Sequence[str], token: _Tensor | None, parents: str, nodes: int
) -> TreeVerdict:
    logits = [o for o in outputs if "logit" in o.name.lower()]
    if token is None or token.dims[-1:] != (nodes,) or not logits or logits[0].dims[-2:-1] not in ((nodes,), ("?",)):
        return TreeVerdict(
            verifies_tree=False,
            nodes=nodes,
            detail=f"parent indices {parents!r} [{nodes}] but the token input or the logits do not have {nodes} rows",
            why="every node needs its token in and its logits row out",
        )
    missing = [s for s in recurrent if not _per_node(outputs, nodes, lambda n, s=s: s in n and n != f"{s}_out")]
    kv_rows = _per_node(outputs, nodes, _KV_NAME.search)
    if missing or not kv_rows:
        lacks = ", ".join([*(f"{s} per node" for s in missing), *([] if kv_rows else ["KV rows per node"])])
        return TreeVerdict(
            verifies_tree=False,
            nodes=nodes,
            detail=f"parent indices {parents!r} [{nodes}] but no output of {lacks}",
            why="the siblings' states differ: the host commits the winning path's, which it must be given",
        )
    per_node = [o.name for o in outputs if nodes in o.dims and "logit" not in o.name.lower()]
    return TreeVerdict(
        verifies_tree=True,
        nodes=nodes,
        detail=f"{nodes} nodes per forward: parent indices {parents!r}; per node out: {', '.join(per_node)} (the host "
        "commits the winning path's)",
    )


def tree_rules(rules: Sequence[Any], verdict: TreeVerdict) -> list[Any]:
    """A tree function's chain rules: it writes no state by design (the host commits the winning path's), so
    ``states-threaded`` and ``recurrent-state`` are judged by its per-node outputs (the verdict)."""
    if not verdict.verifies_tree:
        return list(rules)
    out = []
    for rule in rules:
        if rule.id in ("states-threaded", "recurrent-state") and not rule.passed:
            rule = attrs.evolve(rule, passed=True, why="", detail=f"a tree function commits nothing: {verdict.detail}")
        out.append(rule)
    return out
