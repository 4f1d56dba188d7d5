"""Sampling engines lossy by a controlled total variation, and a correct engine that samples differently.

``TvDeviation(delta=0.04, shape="sharper")`` is ``SamplingZooEngine`` (a correct rejection sampler)
whose ``p`` is replaced everywhere (acceptance, residual, bonus, match's samples) by ``p'`` with
``TV(p', p) = min(delta, room)`` at every position: it samples exactly from ``p'``. ``sharper``
moves ``delta`` onto the top token, taken from the others in proportion (``room = 1 - max p``;
like too low a temperature); ``flatter`` moves it off the top token onto the others in proportion
(``room = max p``; like too high a temperature or a filter not applied). They measure the power of
``engine.sampled-distribution`` (``benchmarks/sampling_power.py --deviations``; docs/contract.md,
"Sampling"); they are not ``ZOO`` members, whose invariant must catch them at ``quick``.

``GumbelSamplingEngine`` is correct: every draw by the Gumbel-max trick (``argmax(log p + G)``) and
acceptance tested in log space, so it samples from ``p`` exactly but emits other tokens than
``SamplingZooEngine`` for the same seed; the checks must accept it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from specproof.conformance.zoo._sampling_engines import SamplingZooEngine
from specproof.contract.sampling import SamplingParams
from specproof.engine.sampling import target_distribution

__all__ = ["DEVIATION_SIZES", "GumbelSamplingEngine", "TvDeviation", "deviate", "gumbel_engine"]

DEVIATION_SIZES = (0.02, 0.03, 0.04, 0.05)  # the power table's columns (total variation)


def deviate(p_row: np.ndarray, delta: float, shape: str) -> np.ndarray:
    """``p'``: ``p_row`` with mass ``min(delta, room)`` moved onto (``sharper``) or off (``flatter``) its top
    token, the other tokens scaled in proportion (no token outside p's support gains mass)."""
    top = int(np.argmax(p_row))
    rest = 1.0 - float(p_row[top])
    if rest <= 0.0:
        return p_row
    moved = min(delta, rest) if shape == "sharper" else -min(delta, float(p_row[top]))
    out = p_row * (1.0 - moved / rest)
    out[top] = p_row[top] + moved
    return out / out.sum()


class TvDeviation(SamplingZooEngine):
    """Samples exactly from ``deviate(p, delta, shape)`` (see the module docstring)."""

    def __init__(self, *, delta: float, shape: str = "sharper", **options: Any) -> None:
        if shape not in ("sharper", "flatter") or not 0.0 < delta < 1.0:
            raise ValueError(f"TvDeviation: shape {shape!r} must be sharper or flatter, delta {delta} in (0, 1)")
        super().__init__(**options)
        self.delta, self.shape = delta, shape
        self.name = f"specproof.zoo.TvDeviation(delta={delta:g}, shape={shape})"

    def _p(self, row: np.ndarray, params: SamplingParams) -> np.ndarray:
        return deviate(target_distribution(row, params), self.delta, self.shape)

    def _p_accept(self, row: np.ndarray, params: SamplingParams) -> np.ndarray:
        return self._p(row, params)


def _gumbel_draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """``argmax(log probs + Gumbel noise)``: a draw from ``probs`` (normalized or not), zeros never drawn."""
    with np.errstate(divide="ignore"):
        scores = np.log(probs) + rng.gumbel(size=probs.shape[0])
    return int(np.argmax(scores))


class GumbelSamplingEngine(SamplingZooEngine):
    """Correct, differently: Gumbel-max draws and log-space acceptance (see the module docstring)."""

    def _sampled_accept(self, draft: list[int], q: np.ndarray, logits: np.ndarray, request: Any) -> list[int]:
        params, rng = request.params, request.rng
        p = np.stack([self._p(row, params) for row in logits])
        for i, x in enumerate(draft):
            if self.scheme == "match":
                token = _gumbel_draw(p[i], rng)
                if token == x:
                    continue
                return [*draft[:i], token]
            # keep x with probability min(1, p/q): an exponential E = -log(U) exceeds log q - log p
            with np.errstate(divide="ignore"):
                if rng.exponential() > np.log(q[i][x]) - np.log(p[i][x]):
                    continue
            residual = np.maximum(p[i] - q[i], 0.0)
            return [*draft[:i], _gumbel_draw(residual if residual.sum() > 0 else p[i], rng)]
        return [*draft, _gumbel_draw(p[len(draft)], rng)]


def gumbel_engine() -> GumbelSamplingEngine:
    """Correct: rejection sampling with Gumbel-max draws (other tokens per seed, the same distribution)."""
    return GumbelSamplingEngine()


def __getattr__(name: str) -> Any:
    """Plug-in specs by name: ``specproof.conformance.zoo._sampling_deviations:sharper_004`` is
    ``TvDeviation(delta=0.04, shape="sharper")`` (three digits: hundredths of total variation)."""
    found = re.fullmatch(r"(sharper|flatter)_(\d{3})", name)
    if found is None or not 0 < int(found[2]) < 100:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    shape, delta = found[1], int(found[2]) / 100

    def make() -> TvDeviation:
        return TvDeviation(delta=delta, shape=shape)

    make.__doc__ = f"Lossy: samples from p with TV {delta:g} moved {'onto' if shape == 'sharper' else 'off'} its top."
    return make
