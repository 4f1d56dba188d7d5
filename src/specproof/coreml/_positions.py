"""The program's position input, in either layout (``ExportOptions.positions``).

``scalar`` (the default): ``position`` int32 ``[1]`` = processed, the tokens already in the caches;
the chunk's rows are ``position + 0..q-1``. ``seed``: ``position_ids`` int32 ``[1, processed + q]``,
the position of every token of the context so far and of the chunk, as the seed's host loop feeds it
(``0 ..< processed + q``); the program reads the LAST q entries as its rows (RoPE angles, causal mask)
and writes the chunk's keys and values from the first of them. Its length grows with the context: a
range dimension ``q..max_context`` beside a fixed ``input_ids`` (docs/coreml.md, "Position layouts").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

__all__ = ["POSITION_LAYOUTS", "chunk_positions", "position_input_type", "position_layout", "position_specs"]

_I32: Final = np.int32


def position_specs(mb: Any, types: Any, get_new_symbol: Any, *, positions: str) -> dict[str, Any]:
    """The MIL input spec of the position input of a ``positions`` layout."""
    if positions == "seed":
        return {"position_ids": mb.TensorSpec((1, get_new_symbol()), dtype=types.int32)}
    return {"position": mb.TensorSpec((1,), dtype=types.int32)}


def position_input_type(ct: Any, *, positions: str, fixed_query: int | None, max_context: int) -> Any:
    """The converter's ``TensorType`` of the position input: ``position_ids`` takes q..max_context entries
    (at least the chunk's q: exactly ``fixed_query`` in a fixed-shape function, else 1)."""
    if positions == "seed":
        low = fixed_query or 1
        dim = ct.RangeDim(low, max_context, default=low)
        return ct.TensorType(name="position_ids", shape=(1, dim), dtype=np.int32)
    return ct.TensorType(name="position", shape=(1,), dtype=np.int32)


def chunk_positions(mb: Any, inputs: Any, q: Any, *, planted: str | None) -> tuple[Any, Any]:
    """(``position`` [1] int32: the chunk's first row, ``rows`` [q] int32 or ``None``: position + 0..q-1).

    ``q`` is the chunk's length ([1] int32). ``planted="positions-first-q"`` (TEST-ONLY) reads the first q
    entries of ``position_ids`` instead of the last q: right at processed = 0 only."""
    if "position_ids" not in inputs:
        return inputs["position"], None
    ids = inputs["position_ids"]  # [1, processed + q]
    length = mb.slice_by_index(x=mb.shape(x=ids), begin=[1], end=[2])  # [1]
    start = np.array([0], _I32) if planted == "positions-first-q" else mb.sub(x=length, y=q)
    begin = mb.concat(values=[np.array([0], _I32), start], axis=0)
    end = mb.concat(values=[np.array([1], _I32), mb.add(x=start, y=q)], axis=0)
    rows = mb.reshape(x=mb.slice_by_index(x=ids, begin=begin, end=end), shape=[-1])  # [q]
    return mb.slice_by_index(x=rows, begin=[0], end=[1]), rows


#: what ``bundle inspect`` reports as a function's position layout (JSON ``position_layout``)
POSITION_LAYOUTS: Final = ("scalar", "seed", "other", "none")


def position_layout(inputs: Sequence[Any], position_input: Any) -> str:
    """``scalar``: a one-element ``position``; ``seed``: ``position_ids`` ``[1, N]`` with N growing with the
    context (a range or symbolic length); ``other``: another position, offset or mask input
    (``position_input``, the ``TensorInfo`` the position rule found); ``none``: no such input."""
    if position_input is None:
        return "none"
    t = position_input
    if t.name == "position" and list(t.dims) == [1]:
        return "scalar"
    if t.name == "position_ids" and len(t.dims) == 2 and t.dims[0] == 1 and t.shape_kind in ("range", "symbolic"):
        return "seed"
    return "other"
