"""How a drafter that decodes a model picks each draft token from a logits row: greedy, or sampled.

``ModelDrafter`` and ``HeadDrafter`` draft token by token from logits rows; ``propose`` takes the
argmax of each row, ``propose_sampled`` draws from the row's processed distribution at the request's
sampling parameters (the engine's own ``target_distribution``, docs/contract.md "Sampling") with the
request's generator, and keeps that distribution as the token's ``q``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampling import SampledDraft, SamplingParams
from specproof.engine._sampling import draw, target_distribution

__all__ = ["Pick", "argmax_pick", "sampled_draft", "sampling_pick"]

Pick = Callable[[np.ndarray], tuple[int, "np.ndarray | None"]]


def argmax_pick(row: np.ndarray) -> tuple[int, None]:
    """The greedy pick: the first maximum (no ``q``: the draft is deterministic)."""
    return int(np.argmax(row)), None


def sampling_pick(sampling: SamplingParams, rng: np.random.Generator) -> Callable[[np.ndarray], tuple[int, np.ndarray]]:
    """A pick that draws the token from the row's processed distribution (one uniform of ``rng``) and
    returns that distribution as its ``q``."""
    if not isinstance(sampling, SamplingParams):
        raise InvalidSettingError(f"propose_sampled: sampling={sampling!r} must be a SamplingParams")
    if not isinstance(rng, np.random.Generator):
        raise InvalidSettingError(f"propose_sampled: rng={rng!r} must be a numpy.random.Generator")

    def pick(row: np.ndarray) -> tuple[int, np.ndarray]:
        q = target_distribution(row, sampling)
        return draw(q, rng), q

    return pick


def sampled_draft(picked: Sequence[tuple[int, np.ndarray | None]], vocab_size: int) -> SampledDraft:
    """The ``SampledDraft`` of tokens picked by ``sampling_pick``: the tokens and their ``q`` rows."""
    rows = [q for _, q in picked if q is not None]
    if len(rows) != len(picked):
        raise AssertionError("sampled_draft: a token was picked without its q row")
    q = np.stack(rows) if rows else np.zeros((0, vocab_size))
    return SampledDraft(tuple(token for token, _ in picked), q)
