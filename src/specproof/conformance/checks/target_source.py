"""``target.matches-source``: the target computes what the model it was converted from computes.

The other target invariants compare a target with fresh copies of itself, so a converted model
of *another* function (a bundle whose router keeps one expert where the source keeps two) that
is consistent with itself passes them. With ``certify target --oracle SPEC`` this check feeds
the drawn prefix and tokens to the target (the prefix in one forward, the tokens in the drawn
chunking) and to a fresh source model (one forward of everything: the source is the trusted
model), and compares every row.

A row may differ by ``atol + rtol x`` its largest |source logit|; both come from the target
(``atol`` its tolerance, ``source_rtol`` what it declares for its precision against the
source; 0 when it declares none: exact). A target declaring ``source_router_margin`` is one
whose lower precision may order two close router logits the other way: rows from the first
position where the source's router margin (``last_router_margins``) is below it are not
compared and not counted (the routing after it may legitimately differ).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from specproof.contract import Violation
from specproof.engine import Target, row_router_margins

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["check_matches_source"]


def _chunked(t: Target, prefix: Sequence[int], tokens: Sequence[int], chunks: Sequence[int]) -> np.ndarray:
    """The target's rows for prefix + tokens: the prefix in one forward, the tokens in ``chunks``."""
    t.reset()
    rows = [np.asarray(t.forward(list(prefix)), np.float64)] if prefix else []
    pos = 0
    for size in [*chunks, len(tokens)]:
        piece = list(tokens[pos : pos + size])
        if not piece:
            break
        rows.append(np.asarray(t.forward(piece), np.float64))
        pos += len(piece)
    return np.concatenate(rows)


def check_matches_source(
    inv: Invariant,
    make: Callable[[], Target],
    make_source: Callable[[], Target],
    prefix: Sequence[int],
    tokens: Sequence[int],
    chunks: Sequence[int],
    *,
    atol: float,
    rtol: float,
    router_margin: float,
) -> tuple[list[Violation], int, str]:
    """(violations, rows compared, note): every row of the target within tolerance of the source's."""
    everything = [*prefix, *tokens]
    source = make_source()
    source.reset()
    want = np.asarray(source.forward(everything), np.float64)
    margins = row_router_margins(source, len(everything))
    got = _chunked(make(), prefix, tokens, chunks)
    example: dict[str, object] = {"prefix": list(prefix), "tokens": list(tokens), "chunks": list(chunks)}
    compared = 0
    for i in range(len(everything)):
        if margins[i] < router_margin:
            break  # this row and every later one may route otherwise at the target's precision
        scale = float(np.abs(want[i]).max())
        err = float(np.abs(got[i] - want[i]).max())
        allowed = atol + rtol * scale
        if not err <= allowed:  # (a NaN row fails too)
            return (
                [
                    inv.violation(
                        explanation=f"position {i}: the target's logits differ from the source's by {err:.4g} > "
                        f"{atol:g} + {rtol:g} x {scale:.4g} (target argmax {int(np.argmax(got[i]))}, source argmax "
                        f"{int(np.argmax(want[i]))})",
                        expected=f"within {allowed:.4g} of the source's row",
                        actual=f"max |difference| {err:.4g}",
                        example=example,
                    )
                ],
                compared,
                "",
            )
        compared += 1
    if compared == 0:
        return [], 0, f"the source's router margin at position 0 is below {router_margin:g}: no row compared"
    excused = len(everything) - compared
    note = f"{compared} rows within {atol:g} + {rtol:g} x the source row's largest |logit|"
    if excused:
        note += f"; {excused} rows after a router margin < {router_margin:g} not compared"
    return [], compared, note
