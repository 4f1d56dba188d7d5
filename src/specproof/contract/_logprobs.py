"""``TokenLogprob``: one emitted token's logprob under the target, after the request's processors
(docs/contract.md, "Decode state", "Logprobs"), with its top-n alternatives where asked."""

from __future__ import annotations

import math

import attrs

__all__ = ["LOGPROB_TOLERANCE", "TokenLogprob"]

LOGPROB_TOLERANCE = 1e-4
"""How far (absolute, in nats) an engine's logprob may be from the oracle's teacher-forced scoring: float64
reference models agree to ~1e-12, so this leaves room for an engine's float32 math, never for a wrong row
(whose error on the suite's models is of the order of a nat)."""


def _pairs(values: object) -> tuple[tuple[int, float], ...]:
    return tuple((int(t), float(lp)) for t, lp in values)  # type: ignore[attr-defined]


@attrs.frozen(kw_only=True)
class TokenLogprob:
    """``token``'s logprob at its position, and ``top``: the ``n`` most likely tokens there as (id, logprob),
    most likely first (the lower id first on a tie); empty unless the request asked for alternatives."""

    token: int = attrs.field(converter=int)
    logprob: float = attrs.field(converter=float)
    top: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_pairs)

    def __attrs_post_init__(self) -> None:
        if math.isnan(self.logprob) or self.logprob > 0.0:
            raise ValueError(f"TokenLogprob for token {self.token}: logprob {self.logprob!r} is not <= 0")

    def to_json(self) -> dict[str, object]:
        return {"token": self.token, "logprob": self.logprob, "top": [list(pair) for pair in self.top]}
