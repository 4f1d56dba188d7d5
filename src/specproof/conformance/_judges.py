"""Judges memoized by the tokens they processed: the trusted copies the checks compare the subject with."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

__all__ = ["JudgeMemo"]


class JudgeMemo:
    """Judges (the reference and the greedy oracle) memoized by the exact tokens they processed.

    A judge is only ever fed forwards from a fresh model, never restored, so a broken restore
    in the subject cannot hide in it; memoizing by the processed tokens only saves the
    re-prefill of a long prompt after a reset or a snapshot round trip, and between the
    checks of one certification (the engine cases and the rollback machine share prompts).
    One memo belongs to one certification (its ``RunCache``): nothing outlives the run.
    ``at`` returns a private copy the caller may feed further. A model with ``forward_without_logits``
    (``ReferenceHybrid``) is fed with it, since nothing reads the prompt's logits.
    """

    def __init__(self, size: int = 24) -> None:
        self.size = size
        self._models: OrderedDict[tuple[object, tuple[int, ...]], Any] = OrderedDict()

    def at(self, factory: Any, tokens: Sequence[int]) -> Any:
        want = tuple(int(t) for t in tokens)
        best: tuple[object, tuple[int, ...]] | None = None
        for key in self._models:
            if key[0] is factory and len(key[1]) <= len(want) and want[: len(key[1])] == key[1]:
                if best is None or len(key[1]) > len(best[1]):
                    best = key
        if best is not None:
            model = copy.deepcopy(self._models[best])
            self._models.move_to_end(best)
            done = len(best[1])
        else:
            model = factory()
            model.reset()
            done = 0
        if len(want) > done:
            # a judge is handed back for its states and later forwards: the prompt's own logits go unread
            feed = getattr(model, "forward_without_logits", None) or model.forward
            feed(list(want[done:]))
        if len(want) > 64 and (factory, want) not in self._models:  # short prefixes are cheaper to feed
            self._models[(factory, want)] = copy.deepcopy(model)
            if len(self._models) > self.size:
                self._models.popitem(last=False)
        return model

    def clear(self) -> None:
        self._models.clear()
