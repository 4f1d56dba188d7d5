"""Sampling: the parameters of a sampled generation and the target's processed distribution ``p``.

docs/contract.md ("Sampling") is the reference. Lossless at ``temperature > 0`` means: the
emitted sequence has the distribution that plain autoregressive sampling from ``p`` gives, where
``p`` at each position is ``processed_distribution(logits_row, params)``.

``processed_distribution`` is the contract's own statement of ``p``, used by the checks as their
oracle. The reference engine keeps an independent copy (``specproof.engine._sampling``) on
purpose: an oracle must not share code with the subject it judges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Integral, Real

import attrs
import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import decimal_int, decimal_number

__all__ = [
    "SAMPLING_SCHEMES",
    "SampledDraft",
    "SamplingParams",
    "parse_sampling",
    "processed_distribution",
]

SAMPLING_SCHEMES: tuple[str, ...] = ("rejection", "match")
"""The two lossless acceptance rules: rejection sampling and sample-and-match (docs/contract.md)."""


def _finite(name: str, value: object, *, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise InvalidSettingError(f"sampling {name}={value!r} must be a finite number")
    number = float(value)
    if number < low or (low_open and number == low) or number > high:
        bracket = "(" if low_open else "["
        raise InvalidSettingError(f"sampling {name}={value!r} must be in {bracket}{low:g}, {high:g}]")
    return number


def _check_temperature(instance: object, attribute: object, value: float) -> None:
    _finite("temperature", value, low=0.0, high=1e6)


def _check_top_k(instance: object, attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:
        raise InvalidSettingError(f"sampling top_k={value!r} must be an integer >= 0 (0: off)")


def _check_top_p(instance: object, attribute: object, value: float) -> None:
    _finite("top_p", value, low=0.0, high=1.0, low_open=True)


def _check_min_p(instance: object, attribute: object, value: float) -> None:
    _finite("min_p", value, low=0.0, high=1.0)
    if float(value) == 1.0:
        raise InvalidSettingError("sampling min_p=1 must be below 1 (1 would keep only exact ties of the top token)")


def _check_seed(instance: object, attribute: object, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= value < 2**63):
        raise InvalidSettingError(f"sampling seed={value!r} must be an integer in [0, 2**63)")


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How a generation samples: ``temperature``, ``top_k`` (0: off), ``top_p`` (1: off),
    ``min_p`` (0: off) and a per-request ``seed`` (None: the engine's own entropy).

    ``temperature == 0`` or ``top_k == 1`` is greedy: ``p`` is one-hot on the first maximum.
    """

    temperature: float = attrs.field(default=1.0, validator=_check_temperature, converter=float)
    top_k: int = attrs.field(default=0, validator=_check_top_k)
    top_p: float = attrs.field(default=1.0, validator=_check_top_p, converter=float)
    min_p: float = attrs.field(default=0.0, validator=_check_min_p, converter=float)
    seed: int | None = attrs.field(default=None, validator=_check_seed)

    @property
    def greedy(self) -> bool:
        """``p`` is one-hot on the argmax: sampling equals greedy decoding exactly."""
        return self.temperature == 0.0 or self.top_k == 1

    def with_seed(self, seed: int | None) -> SamplingParams:
        return attrs.evolve(self, seed=seed)

    def to_json(self) -> dict[str, object]:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "seed": self.seed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> SamplingParams:
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise InvalidSettingError(f"sampling: unknown parameter {unknown[0]!r} (known: {', '.join(_FIELDS)})")
        return cls(**data)  # type: ignore[arg-type]

    def describe(self) -> str:
        """``temperature=0.8,top_p=0.95`` (the options that differ from off; what ``parse_sampling`` reads)."""
        parts = [f"temperature={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top_p={self.top_p:g}")
        if self.min_p > 0.0:
            parts.append(f"min_p={self.min_p:g}")
        if self.seed is not None:
            parts.append(f"seed={self.seed}")
        return ",".join(parts)


_FIELDS: tuple[str, ...] = ("temperature", "top_k", "top_p", "min_p", "seed")


def parse_sampling(text: str) -> SamplingParams:
    """``"temperature=0.8,top_p=0.95[,top_k=K,min_p=M,seed=S]"`` as ``SamplingParams`` (bad text names
    the part at fault)."""
    values: dict[str, object] = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        name, eq, raw = part.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or name not in _FIELDS:
            raise InvalidSettingError(
                f"sampling: {part!r} is not NAME=VALUE with NAME one of {', '.join(_FIELDS)} "
                "(e.g. temperature=0.8,top_p=0.95)"
            )
        if name in values:
            raise InvalidSettingError(f"sampling: {name} is given twice")
        try:  # strict: "temperature=1_0" is no 10, "nan" and "inf" no temperature
            values[name] = decimal_int(raw) if name in ("top_k", "seed") else decimal_number(raw)
        except InvalidSettingError as err:
            raise InvalidSettingError(f"sampling {name}={raw.strip()!r} must be {err}") from None
    if "temperature" not in values:
        raise InvalidSettingError("sampling: give temperature=T (temperature=0 is greedy)")
    return SamplingParams(**values)  # type: ignore[arg-type]


@attrs.frozen
class SampledDraft:
    """What a sampling drafter proposes: ``tokens`` and ``q``, one proposal-distribution row per
    token (``q[i]`` the distribution ``tokens[i]`` was drawn from, given the context and
    ``tokens[:i]``). A drafter without ``propose_sampled`` is deterministic: its ``q`` is one-hot."""

    tokens: tuple[int, ...] = attrs.field(converter=lambda v: tuple(int(t) for t in v))
    q: np.ndarray = attrs.field(eq=False, repr=False)


def _order(values: np.ndarray) -> np.ndarray:
    """Token ids by value descending, the lower id first among equals (the tie rule of greedy)."""
    return np.lexsort((np.arange(values.shape[0]), -values))


def processed_distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """``p``: the distribution plain sampling draws the next token from (float64, sums to 1).

    For one row of logits (or each row of a 2-D array), in this order:

    1. greedy (``temperature == 0`` or ``top_k == 1``): one-hot on the first maximum;
    2. ``z = logits / temperature`` in float64;
    3. ``top_k > 0``: keep the ``top_k`` tokens first in the order (z descending, lower id first
       among equals); the rest get probability 0;
    4. softmax over the kept tokens;
    5. ``top_p < 1``: in the order (probability descending, lower id first), keep each token while
       the mass of the tokens before it is below ``top_p`` (the first token is always kept);
    6. ``min_p > 0``: drop the tokens whose probability is below ``min_p`` times the largest;
    7. renormalize. A token whose ``p`` is 0 is never emitted.

    Logits of ``-inf`` are tokens with probability 0; NaN, ``+inf`` or a row with no finite logit
    is an ``InvalidSettingError`` (a target that returns them breaks ``target.logits`` first).
    """
    rows = np.asarray(logits, dtype=np.float64)
    if rows.ndim == 2:
        return np.stack([processed_distribution(row, params) for row in rows]) if len(rows) else rows.copy()
    if rows.ndim != 1 or rows.shape[0] == 0:
        raise InvalidSettingError(f"processed_distribution takes a row of logits, got shape {rows.shape}")
    if np.isnan(rows).any() or np.isposinf(rows).any() or not np.isfinite(rows).any():
        raise InvalidSettingError("processed_distribution: the logits hold NaN, +inf, or no finite value")
    vocab = rows.shape[0]
    if params.greedy:
        out = np.zeros(vocab)
        out[int(np.argmax(rows))] = 1.0
        return out
    z = rows / params.temperature
    keep = np.isfinite(z)
    if params.top_k and params.top_k < vocab:
        ranked = _order(np.where(keep, z, -np.inf))
        cut = np.zeros(vocab, dtype=bool)
        cut[ranked[: params.top_k]] = True
        keep &= cut
    probs = np.zeros(vocab)
    top = z[keep].max()
    probs[keep] = np.exp(z[keep] - top)
    probs /= probs.sum()
    if params.top_p < 1.0:
        ranked = _order(probs)
        before = np.concatenate(([0.0], np.cumsum(probs[ranked])[:-1]))
        dropped = ranked[before >= params.top_p]
        probs[dropped] = 0.0
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    return probs / probs.sum()
