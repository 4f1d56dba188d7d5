"""The router near-tie rule's one source of truth: per row, a source model's smallest router margin.

A model whose mixture-of-experts blocks report their router margins (``last_router_margins``:
``ReferenceHybrid``) says, per MoE layer and row of its last forward, how far its chosen experts'
router scores stand from the unchosen ones' (in logit units). A lower-precision copy (an fp16
bundle) may order a pair closer than its own error the other way: that row takes other experts,
and every later row, through the cache and the recurrent state, may legitimately drift. So a
comparison with such a source stops at the first row whose margin is below the declared router
margin: ``bundle check`` (rows, states, greedy), ``certify target --oracle`` (rows) and
``check-trace --target --router-margin`` (greedy) all read the margins here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["row_router_margins"]


def row_router_margins(source: Any, rows: int) -> np.ndarray:
    """Per row of ``source``'s last forward (``rows`` of them), its smallest router margin over the MoE
    layers; ``inf`` everywhere when the source reports none (a dense model, ``hf:``, ``mlx:``, a bundle)."""
    margins = getattr(source, "last_router_margins", None)
    if not margins:
        return np.full(rows, np.inf)
    return np.asarray(np.min(np.stack([np.asarray(m, np.float64) for m in margins]), axis=0))
