"""The routers of the reference target's mixture-of-experts blocks: which experts a row runs, and their weights.

- ``softmax`` (Mixtral, Qwen3-Next / Qwen3.5 MoE with ``norm_topk_prob``): ``p = softmax(logits)``, the top k of
  ``p``, their ``p`` renormalised to sum 1.
- ``sigmoid`` (LFM2-MoE, transformers ``Lfm2MoeSparseMoeBlock.route_tokens_to_experts`` with ``use_expert_bias``
  and ``norm_topk_prob``): ``s = sigmoid(logits)``; the top k of ``s + expert_bias`` (the bias steers the
  SELECTION only); their ``s`` (without the bias) divided by ``sum + 1e-6``.

Ties go to the lower expert index (a stable sort), in the scores the selection ranks. Every operation maps
rows independently, so the reference stays exactly batch-invariant.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = ["NORM_EPS", "ROUTERS", "SIGMOID_MARGIN_SCALE", "select_experts"]

_Arr = npt.NDArray[Any]

ROUTERS: Final = ("softmax", "sigmoid")
NORM_EPS: Final = 1e-6  # LFM2-MoE's renormalisation epsilon (routing_weights / (sum + 1e-6))
#: a logit error of d moves a sigmoid score by at most d / 4: the sigmoid router's selection gaps, times 4, are
#: in the softmax router's units (logit gaps), so one declared router margin means the same for both
SIGMOID_MARGIN_SCALE: Final = 4.0


def _top_k(scores: _Arr, k: int) -> npt.NDArray[np.intp]:
    # a stable sort of -scores keeps the lower expert index first among equal scores
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


def select_experts(logits: _Arr, k: int, expert_bias: _Arr | None) -> tuple[npt.NDArray[np.intp], _Arr, _Arr]:
    """``(chosen [q, k], weights [q, k], ranked [q, E])`` for router ``logits`` ``[q, E]``: the softmax router
    when ``expert_bias`` is None, else the sigmoid router with that bias. ``ranked`` holds the scores the
    selection ranked, in logit units (``router_margins`` reads its gaps)."""
    if expert_bias is None:
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs = e / np.add.reduce(e, axis=-1, keepdims=True)
        chosen = _top_k(probs, k)
        w = np.take_along_axis(probs, chosen, axis=-1)
        return chosen, w / np.add.reduce(w, axis=-1, keepdims=True), logits
    scores = 1.0 / (1.0 + np.exp(-logits))
    selection = scores + expert_bias
    chosen = _top_k(selection, k)
    w = np.take_along_axis(scores, chosen, axis=-1)
    w = w / (np.add.reduce(w, axis=-1, keepdims=True) + np.float32(NORM_EPS))
    return chosen, w, selection * np.float32(SIGMOID_MARGIN_SCALE)
