"""The reference target's tree pass (docs/contract.md, "Trees"): every node through the one-token forward,
from its parent's conv window, recurrent state and root-path KV rows.

A node's row is then the row of sequential decoding of its root path, bit for bit, by the model's exact
chunk invariance. ``ReferenceHybrid.forward_tree`` validates the tree and calls ``tree_forward``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from specproof.contract.errors import CapacityError, InvalidSettingError

__all__ = ["root_path", "tree_forward"]

_F32 = np.float32
_Arr = npt.NDArray[Any]


def _check_tree_parents(parents: Sequence[int], n: int) -> tuple[int, ...]:
    """``parents`` as a tuple, or ``InvalidSettingError`` naming the first entry that is not ``-1`` or an
    earlier node (docs/contract.md, "Trees": parents before children)."""
    if isinstance(parents, (str, bytes)) or not isinstance(parents, Iterable):
        raise InvalidSettingError(f"ReferenceHybrid.forward_tree: parents must be a sequence of ints, got {parents!r}")
    out = list(parents)
    if len(out) != n:
        raise InvalidSettingError(f"ReferenceHybrid.forward_tree: {n} tokens but {len(out)} parents")
    for i, parent in enumerate(out):
        if isinstance(parent, bool) or not isinstance(parent, (int, np.integer)) or not -1 <= parent < i:
            raise InvalidSettingError(
                f"ReferenceHybrid.forward_tree: parents[{i}]={parent!r} must be -1 (the context) or a node in [0, {i})"
            )
    return tuple(int(p) for p in out)


def _tree_depths(parents: tuple[int, ...]) -> list[int]:
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def root_path(parents: tuple[int, ...], node: int) -> list[int]:
    """The nodes from a root down to ``node``."""
    out: list[int] = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def tree_forward(
    model: Any, toks: npt.NDArray[np.intp], parents: Sequence[int], *, snapshot: type
) -> tuple[_Arr, list[object]]:
    """``ReferenceHybrid.forward_tree`` over validated ``toks``: validates the tree first (nothing changes
    on bad input), then runs every node from the node ``model._tree_sources`` names (the parent, when
    correct); ``snapshot``: the model's snapshot class, for the checkpoints."""
    tree = _check_tree_parents(parents, len(toks))
    depths = _tree_depths(tree)
    if depths and model.processed + max(depths) > model.max_context:
        raise CapacityError(
            f"ReferenceHybrid.forward_tree: processed={model.processed} + tree depth={max(depths)} exceeds "
            f"max_context={model.max_context}; nothing was changed"
        )
    sources = model._tree_sources(tree)
    base = model._processed
    entry_conv, entry_rec = model._conv_state.copy(), model._rec_state.copy()
    try:
        logits, convs, recs, keys, values = _run_nodes(model, toks, tree, sources, entry_conv, entry_rec)
    finally:
        np.copyto(model._conv_state, entry_conv)
        np.copyto(model._rec_state, entry_rec)
        model._processed = base
    return logits, [_checkpoint(model, snapshot, tree, i, base, (convs, recs, keys, values)) for i in range(len(tree))]


def _run_nodes(
    model: Any,
    toks: npt.NDArray[np.intp],
    tree: tuple[int, ...],
    sources: tuple[tuple[int, ...], tuple[int, ...]],
    entry_conv: _Arr,
    entry_rec: _Arr,
) -> tuple[_Arr, _Arr, _Arr, _Arr, _Arr]:
    conv_src, rec_src = sources
    base, n = model._processed, len(tree)
    logits = np.zeros((n, model.vocab_size), _F32)
    convs = np.zeros((n, *entry_conv.shape), _F32)
    recs = np.zeros((n, *entry_rec.shape), _F32)
    keys = np.zeros((n, *model._keys_t.shape[:3]), _F32)  # [node, layer, kv, hd]
    values = np.zeros((n, *model._value_cache.shape[:2], model._value_cache.shape[3]), _F32)
    for i in range(n):
        path = root_path(tree, i)
        for depth, node in enumerate(path[:-1]):  # the ancestors' KV rows, where sequential decoding has them
            model._keys_t[..., base + depth] = keys[node]
            model._value_cache[:, :, base + depth] = values[node]
        np.copyto(model._conv_state, entry_conv if conv_src[i] < 0 else convs[conv_src[i]])
        np.copyto(model._rec_state, entry_rec if rec_src[i] < 0 else recs[rec_src[i]])
        pos = base + len(path) - 1
        model._processed = pos
        row, _, _ = model._run(toks[i : i + 1], record=False)
        logits[i] = row[0]
        convs[i], recs[i] = model._conv_state, model._rec_state
        keys[i] = model._keys_t[..., pos]
        values[i] = model._value_cache[:, :, pos]
    return logits, convs, recs, keys, values


def _checkpoint(
    model: Any,
    snapshot: type,
    tree: tuple[int, ...],
    i: int,
    base: int,
    states: tuple[_Arr, _Arr, _Arr, _Arr],
) -> Any:
    """Node ``i``'s checkpoint: its conv and recurrent state and its root path's KV rows (read-only)."""
    convs, recs, keys, values = states
    path = root_path(tree, i)
    conv, rec = convs[i].copy(), recs[i].copy()
    path_keys = np.ascontiguousarray(np.moveaxis(keys[path], 0, -1))  # [layer, kv, hd, depth]
    path_values = np.ascontiguousarray(np.moveaxis(values[path], 0, 2))  # [layer, kv, depth, hd]
    for arr in (conv, rec, path_keys, path_values):
        arr.flags.writeable = False
    return snapshot(
        processed=base + len(path),
        conv_state=conv,
        rec_state=rec,
        target_id=model._id,
        write_clock=model._clock,
        kv_base=base,
        path_keys_t=path_keys,
        path_values=path_values,
    )
