"""Correct implementations that differ from specproof's own, for ``tests/conformance/test_certify_accepts.py``.

Certification must accept every one of these: a suite that rejects a correct
drafter because it breaks ties differently, never drafts, or returns numpy arrays,
or a target because its batched kernel rounds differently, is a suite nobody can use.
They are plug-ins (``_good_implementations:<factory>``; ``tests/`` is on ``sys.path``
when pytest runs the project's tests).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from specproof.conformance.zoo import ZOO_CONFIG
from specproof.engine import ReferenceHybrid
from specproof.engine.targets.reference import ReferenceConfig

__all__ = [
    "EarliestNgramDrafter",
    "NeverDrafter",
    "NumpyArrayDrafter",
    "RoundingTarget",
    "earliest_ngram",
    "never_drafts",
    "numpy_drafts",
    "rounding_target",
    "rounding_target_config",
]


class EarliestNgramDrafter:
    """Prompt lookup written from scratch, with the other tie-break: the *earliest* earlier occurrence.

    For ``n`` from ``max_n`` down to 1: if the last ``n`` tokens occurred earlier, propose
    up to ``k`` tokens that followed their first occurrence. A plain scan, no index:
    deliberately nothing in common with ``NgramDrafter`` but the idea.
    """

    def __init__(self, max_n: int = 4) -> None:
        self.max_n = max_n
        self.name = f"tests.EarliestNgramDrafter(max_n={max_n})"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        tokens = [int(t) for t in context]
        size = len(tokens)
        for n in range(min(self.max_n, size - 1), 0, -1):
            suffix = tokens[size - n :]
            # occurrences that end before the suffix starts ending, so a continuation exists
            for start in range(0, size - n):
                if tokens[start] == suffix[0] and tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + k]
        return []


class NeverDrafter:
    """Proposes nothing, ever: speculative decoding degenerates to plain greedy, which is lossless."""

    name = "tests.NeverDrafter"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return []


class NumpyArrayDrafter:
    """``EarliestNgramDrafter``'s drafts as 1-D ``np.int32`` arrays (what a vectorised drafter returns)."""

    name = "tests.NumpyArrayDrafter"

    def __init__(self) -> None:
        self._inner = EarliestNgramDrafter(max_n=2)

    def propose(self, context: Sequence[int], k: int) -> np.ndarray:
        return np.asarray(self._inner.propose(context, k), dtype=np.int32)


def rounding_target_config() -> ReferenceConfig:
    """A small hybrid (every block kind) that keeps the target certification fast: the zoo's, reseeded."""
    return attrs.evolve(ZOO_CONFIG, seed=5)


def _ulp_noise(logits: np.ndarray) -> np.ndarray:
    """Move about two thirds of the logits one ulp up or down, in a pattern that depends on q.

    This is what a batched BLAS kernel does to a ``[q, d] @ [d, v]`` product: the
    same values, rounded differently for each q. Rows of a one-token forward are exact.
    """
    q, v = logits.shape
    if q <= 1:
        return logits
    rows = np.arange(q)[:, None]
    cols = np.arange(v)[None, :]
    pattern = (rows * 31 + cols * 17 + q) % 3
    up = np.nextafter(logits, np.float32(np.inf))
    down = np.nextafter(logits, np.float32(-np.inf))
    return np.where(pattern == 0, up, np.where(pattern == 1, down, logits)).astype(logits.dtype)


class RoundingTarget:
    """A ``ReferenceHybrid`` whose q > 1 forwards differ from one-token forwards by ±1 ulp.

    It states its numerical tolerance as ``tie_tolerance`` (which the suite reads),
    as a real fp32 backend with batch-dependent kernels would.
    """

    tie_tolerance = 1e-4

    def __init__(self) -> None:
        self._model = ReferenceHybrid(rounding_target_config())
        self.vocab_size = self._model.vocab_size
        self.max_context = self._model.max_context
        self.name = "tests.RoundingTarget"

    @property
    def processed(self) -> int:
        return self._model.processed

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        return _ulp_noise(self._model.forward(tokens))

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[np.ndarray, list[object]]:
        logits, checkpoints = self._model.forward_with_checkpoints(tokens)
        return _ulp_noise(logits), checkpoints

    def snapshot(self) -> object:
        return self._model.snapshot()

    def restore(self, snapshot: object) -> None:
        self._model.restore(snapshot)

    def reset(self) -> None:
        self._model.reset()

    def state_arrays(self) -> dict[str, np.ndarray]:
        return self._model.state_arrays()

    def describe(self) -> str:
        return f"tests.RoundingTarget (±1 ulp on q > 1 forwards) over {self._model.describe()}"


def earliest_ngram() -> EarliestNgramDrafter:
    return EarliestNgramDrafter()


def never_drafts() -> NeverDrafter:
    return NeverDrafter()


def numpy_drafts() -> NumpyArrayDrafter:
    return NumpyArrayDrafter()


def rounding_target() -> RoundingTarget:
    return RoundingTarget()
