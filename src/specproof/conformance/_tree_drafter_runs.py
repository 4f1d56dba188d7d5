"""The sampled tree search with a real tree drafter (docs/contract.md, "Sampled trees"; configuration
``rejection/top-k-tree-drafter`` of ``tree.sampled-distribution``).

The suite's own trees (``SuiteTreeSampler``) are deterministic: each node's ``q`` is one-hot. Here the trees
are a ``TopKTreeDrafter``'s sampled ones (``propose_tree_sampled``: children drawn without replacement from the
drafter's ``q``, each node's row declared), so the engine's sibling rule is judged with non-trivial ``q`` rows
and the drafter's declared rows with it. The drafter: a ``ModelDrafter`` over the oracle's model with its
logits scaled by ``SHARPEN`` (a draft model close to the target but not it: most roots accepted, many
rejected), static ``2x2x2`` shape by default.

A sampled tree is random, so the suite trees' events (which condition on the tree) do not apply. The events
here are fixed by the emitted past alone, at every emitted position (under any lossless rule the emitted
sequence has plain sampling's law, so each token is drawn from ``p`` given the tokens before it): "the token
is the target's most likely one" and "... one of its two most likely". A declared ``q`` that is not the row
a sibling was drawn from (a top-k child declared as drawn from ``q``, a row before temperature) moves mass
onto or off the favourites, which drafter and target share; the all-token PIT test runs as for the suite's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specproof.conformance._tree_sampled_runs import DraftSource, TreeSampledSearch
from specproof.engine.drafters.model import ModelDrafter
from specproof.engine.drafters.trees import TopKTreeDrafter

__all__ = ["DRAFTER_EVENTS", "SHARPEN", "ScaledModel", "top_k_tree_source"]

SHARPEN = 1.5
"""The drafter model's logits are the oracle's times this (at T = 0.8 its q is the oracle's at T ~ 0.53)."""
DRAFTER_EVENTS: dict[str, str] = {
    "top": "the emitted token is the target's most likely one given the emitted past (probability p of it)",
    "top-2": "the emitted token is one of the target's two most likely given the emitted past (probability p of them)",
}


class ScaledModel:
    """A model whose logits are ``inner``'s times ``scale`` (every other call passed through)."""

    def __init__(self, inner: Any, scale: float) -> None:
        self.inner, self.scale = inner, float(scale)
        self.vocab_size = int(inner.vocab_size)
        self.max_context = int(inner.max_context)

    @property
    def processed(self) -> int:
        return int(self.inner.processed)

    def reset(self) -> None:
        self.inner.reset()

    def snapshot(self) -> object:
        return self.inner.snapshot()

    def restore(self, state: object) -> None:
        self.inner.restore(state)

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        return np.asarray(self.inner.forward(tokens), dtype=np.float64) * self.scale


def _score_top_events(
    search: TreeSampledSearch,
    p: np.ndarray,
    prompt: Sequence[int],
    tokens: list[int],
    calls: Sequence[Any],
) -> None:
    """The two events at every emitted position (each fixed by the emitted past: ``p``'s most likely tokens)."""
    for row, token in zip(p, tokens, strict=True):
        ranked = [int(t) for t in np.lexsort((np.arange(row.shape[0]), -row))[:2]]
        search.tests["top"].add(token == ranked[0], float(row[ranked[0]]))
        search.tests["top-2"].add(token in ranked, float(row[ranked].sum()))


def top_k_tree_source(shape: str = "2x2x2", *, wrap: Callable[[TopKTreeDrafter], Any] | None = None) -> DraftSource:
    """The search's source of sampled top-k trees of ``shape`` (``wrap``: the tests plant a broken drafter)."""

    def make(make_reference: Callable[[], Any]) -> Any:
        model = ScaledModel(make_reference(), SHARPEN)
        drafter = TopKTreeDrafter(ModelDrafter(model, rollback="replay"), shape)  # type: ignore[arg-type]
        return drafter if wrap is None else wrap(drafter)

    return DraftSource(
        configuration=f"rejection/top-k-tree-drafter({shape})",
        events=DRAFTER_EVENTS,
        make=make,
        score=_score_top_events,
    )
