"""A sequential test of event frequencies with a false-fail bound that holds at every sample size.

The sampling checks (docs/contract.md, "Sampling") score each emitted token on an *event* chosen
before the token was drawn (it depends only on the prefix and the round's draft): "the token equals
the suite's draft token", "the token is the target's top token", ... Under losslessness the event has
probability ``pi`` = its mass under the target's processed distribution ``p``, so the increments
``D_i = 1[event_i] - pi_i`` form a martingale with ``|D_i| <= 1`` and predictable variance
``pi_i (1 - pi_i)``, whatever the scheme, the draft or the stopping rule.

**The bound: Freedman's inequality** (D. A. Freedman, "On tail probabilities for martingales",
Ann. Probab. 3, 1975): for ``S_n = sum D_i`` with ``D_i <= 1`` and ``V_n = sum Var(D_i | past)``,
``P(exists n: S_n >= a and V_n <= v) <= exp(-a^2 / (2 (v + a / 3)))``. It is non-asymptotic and
holds uniformly over ``n``, so the test may look after every generation and stop as soon as it has
the sensitivity it wants. ``V_n`` is random, so it is peeled over the grid ``v_j = 2^j``
(``j < GRID``) and both signs, each of the ``2 * GRID`` events given ``alpha / (2 * GRID)``: the test
rejects when ``|S_n| >= a_j`` for the first grid value ``v_j >= V_n``. Hence
``P(false fail) <= alpha`` at the sample sizes used. Why not a CLT test: its error at a few hundred
events with ``pi`` near 0 or 1 is not bounded; why not Hoeffding: it charges variance 1/4 per event
where the target's ``p`` is often peaked (variance near 0), and loses most of the power.

**Sensitivity.** ``min_detectable``: the smallest uniform per-event drift ``delta`` (a deviation
that moves total-variation mass ``delta`` onto or off the event at every scored position) the run
rejects with probability at least 0.99: ``(a + z_{0.99} sqrt(V_n)) / n``, the normal approximation
of ``S_n``'s spread under the alternative (the power figure is approximate; the false-fail bound
is not).
"""

from __future__ import annotations

import math

import attrs

__all__ = ["FALSE_FAIL_BOUND", "GRID", "POWER_Z", "EventTest", "freedman_threshold"]

FALSE_FAIL_BOUND = 1e-6
"""The probability that one statistical sampling check fails a lossless subject (split over its tests)."""

GRID = 48  # v_j = 2^j for j < 48: more variance than any run accumulates
POWER_Z = 2.3263478740408408  # the standard normal's 0.99 quantile


def freedman_threshold(variance: float, alpha: float) -> float:
    """``a``: reject ``|S_n| >= a`` where ``V_n <= v_j`` (the first grid value above ``variance``)."""
    v = 1.0
    while v < variance:
        v *= 2.0
    log_term = math.log(2 * GRID / alpha)
    third = log_term / 3.0
    return third + math.sqrt(third * third + 2.0 * v * log_term)


@attrs.define
class EventTest:
    """One event's running sum ``S_n`` and predictable variance ``V_n`` over the scored positions."""

    name: str
    summary: str  # what the event is, for a failure message
    alpha: float
    n: int = 0
    total: float = 0.0  # S_n
    variance: float = 0.0  # V_n
    hits: int = 0
    expected: float = 0.0  # sum of pi

    def add(self, happened: bool, probability: float) -> None:
        pi = min(max(float(probability), 0.0), 1.0)
        self.n += 1
        self.hits += int(happened)
        self.expected += pi
        self.total += float(happened) - pi
        self.variance += pi * (1.0 - pi)

    @property
    def threshold(self) -> float:
        return freedman_threshold(self.variance, self.alpha)

    @property
    def rejected(self) -> bool:
        return self.n > 0 and abs(self.total) >= self.threshold

    @property
    def min_detectable(self) -> float:
        """The smallest per-event drift this run detects with power 0.99 (inf before any event)."""
        if self.n == 0:
            return math.inf
        return (self.threshold + POWER_Z * math.sqrt(self.variance)) / self.n

    def describe(self) -> str:
        return (
            f"{self.name}: {self.hits} of {self.n} events vs {self.expected:.1f} expected under p "
            f"(S={self.total:+.1f}, threshold {self.threshold:.1f}; detects a TV drift of {self.min_detectable:.3f})"
        )
