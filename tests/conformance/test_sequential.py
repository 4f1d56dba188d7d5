"""Meta-tests of the sampling checks' statistical test (``_sequential.EventTest``, Freedman's inequality).

Simulated martingales, not engines: each simulated run feeds a test ``n`` Bernoulli events with known
probabilities ``pi_i`` and looks at ``rejected`` after every event (as the checks do after every
generation: the bound must hold at every sample size). At ``alpha = 0.05`` false fails are frequent
enough to count, so the observed rate is compared with ``alpha`` by an exact binomial margin. A drift of
``min_detectable`` must be rejected in most runs; a CLT z-test, the test the docstring of
``_sequential`` rules out, is rejected by the same meta-test. numpy Generators with fixed seeds: every
figure here is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy as np
import pytest

from specproof.conformance._sequential import EventTest, freedman_threshold

ALPHA = 0.05  # large, so false fails are observable (the checks use 1e-6 split over their tests)
MARGIN_TAIL = 1e-6  # the meta-test's own false-fail probability (it is deterministic, seeded, anyway)


class SequentialTest(Protocol):
    def add(self, happened: bool, probability: float) -> None: ...

    @property
    def rejected(self) -> bool: ...


def binomial_upper(runs: int, rate: float, tail: float = MARGIN_TAIL) -> int:
    """The smallest ``c`` with ``P(Binomial(runs, rate) > c) <= tail`` (exact, in log space)."""
    log_pmf = [
        math.lgamma(runs + 1)
        - math.lgamma(k + 1)
        - math.lgamma(runs - k + 1)
        + k * math.log(rate)
        + (runs - k) * math.log1p(-rate)
        for k in range(runs + 1)
    ]
    above = 0.0  # P(X > c), accumulated from the top
    for c in range(runs, -1, -1):
        if above + math.exp(log_pmf[c]) > tail:
            return c
        above += math.exp(log_pmf[c])
    return 0


def binomial_lower(runs: int, rate: float, tail: float = MARGIN_TAIL) -> int:
    """The largest ``c`` with ``P(Binomial(runs, rate) < c) <= tail``."""
    return runs - binomial_upper(runs, 1.0 - rate, tail)


def varied_probabilities(rng: np.random.Generator, runs: int, n: int) -> np.ndarray:
    """``(runs, n)`` event probabilities, one regime per run: uniform, near 0, near 1, U-shaped (Beta(0.3, 0.3))."""
    regimes = [
        lambda size: rng.uniform(0.0, 1.0, size),
        lambda size: rng.uniform(0.001, 0.05, size),
        lambda size: rng.uniform(0.95, 0.999, size),
        lambda size: rng.beta(0.3, 0.3, size),
    ]
    return np.stack([regimes[r % len(regimes)](n) for r in range(runs)])


def rejections(make_test: Callable[[], SequentialTest], probabilities: np.ndarray, happened: np.ndarray) -> int:
    """How many runs (rows) the test rejects at some event, looking after every one."""
    count = 0
    for pis, hits in zip(probabilities.tolist(), happened.tolist(), strict=True):
        test = make_test()
        for pi, hit in zip(pis, hits, strict=True):
            test.add(hit, pi)
            if test.rejected:
                count += 1
                break
    return count


def assert_false_fails_within(false_fails: int, runs: int, alpha: float) -> None:
    """The meta-test: a valid level-``alpha`` test fails at most ``binomial_upper(runs, alpha)`` of ``runs``
    null runs."""
    limit = binomial_upper(runs, alpha)
    assert false_fails <= limit, (
        f"{false_fails} false fails in {runs} runs under H0, above {limit} "
        f"(P(Binomial({runs}, {alpha}) > {limit}) <= {MARGIN_TAIL:g}): the test is not level {alpha}"
    )


def freedman(alpha: float = ALPHA) -> Callable[[], SequentialTest]:
    return lambda: EventTest(name="event", summary="simulated", alpha=alpha)


class CltZTest:
    """A broken test: reject when ``S_n / sqrt(V_n) >= z`` (one-sided) or ``|S_n| / sqrt(V_n) >= z``, the
    normal approximation with no finite-sample or optional-stopping correction."""

    def __init__(self, z: float, *, two_sided: bool) -> None:
        self.z, self.two_sided = z, two_sided
        self.total = self.variance = 0.0

    def add(self, happened: bool, probability: float) -> None:
        self.total += float(happened) - probability
        self.variance += probability * (1.0 - probability)

    @property
    def rejected(self) -> bool:
        if self.variance <= 0.0:
            return False
        stat = self.total / math.sqrt(self.variance)
        return (abs(stat) if self.two_sided else stat) >= self.z


# ------------------------------------------------------------------------------ the margins


def test_binomial_margins_are_exact_tails() -> None:
    """The margins are the exact tails (checked against a direct sum at a small size)."""
    runs, rate = 30, 0.2
    pmf = [math.comb(runs, k) * rate**k * (1 - rate) ** (runs - k) for k in range(runs + 1)]
    c = binomial_upper(runs, rate, tail=0.01)
    assert sum(pmf[c + 1 :]) <= 0.01 < sum(pmf[c:])
    low = binomial_lower(runs, rate, tail=0.01)
    assert sum(pmf[:low]) <= 0.01 < sum(pmf[: low + 1])


# ------------------------------------------------------------------------------ level and power of EventTest


def test_false_fail_rate_under_h0_is_at_most_alpha() -> None:
    """2000 simulated null runs of 400 events (probabilities uniform, near 0, near 1, U-shaped), looked at
    after every event: the false-fail count is within alpha's binomial margin."""
    rng = np.random.default_rng(28)
    runs, n = 2000, 400
    probabilities = varied_probabilities(rng, runs, n)
    happened = rng.random((runs, n)) < probabilities
    false_fails = rejections(freedman(), probabilities, happened)
    assert_false_fails_within(false_fails, runs, ALPHA)


def test_false_fail_rate_at_small_n_and_rare_events() -> None:
    """Where a normal approximation is worst (20 events of probability 0.01): still within alpha."""
    rng = np.random.default_rng(29)
    runs, n = 2000, 20
    probabilities = np.full((runs, n), 0.01)
    happened = rng.random((runs, n)) < probabilities
    assert_false_fails_within(rejections(freedman(), probabilities, happened), runs, ALPHA)


@pytest.mark.parametrize("sign", [+1, -1], ids=["onto-the-event", "off-the-event"])
def test_drift_of_min_detectable_is_rejected(sign: int) -> None:
    """A drift of ``min_detectable`` (read off the test after the schedule's 400 events) moves the event's
    probability by that much at every event; the runs reject it in at least 90% of 1000 runs.

    ``min_detectable`` claims power 0.99 by a normal approximation of ``S_n`` (with the null variance);
    the assertion's 0.9 leaves that approximation a margin of 0.09, and its count limit (the binomial
    lower tail of 0.9 at 1e-6) leaves the simulation's sampling error. Both signs: the test is two-sided."""
    rng = np.random.default_rng(30)
    runs, n = 1000, 400
    schedule = rng.uniform(0.25, 0.75, n)  # room for the drift either way
    sized = EventTest(name="event", summary="sizing", alpha=ALPHA)
    for pi in schedule:
        sized.add(False, float(pi))  # V_n depends on the probabilities only, so min_detectable does too
    delta = sized.min_detectable
    assert 0.0 < delta < 0.25
    probabilities = np.broadcast_to(schedule, (runs, n))
    happened = rng.random((runs, n)) < probabilities + sign * delta
    detected = rejections(freedman(), probabilities, happened)
    assert detected >= binomial_lower(runs, 0.9), f"{detected} of {runs} runs detected a drift of {delta:.3f}"
    # and a drift well below it mostly goes unseen: min_detectable is not a loose figure
    weak = rng.random((runs, n)) < probabilities + sign * delta / 3
    assert rejections(freedman(), probabilities, weak) <= runs // 2


def test_threshold_grows_with_variance_and_shrinks_with_alpha() -> None:
    """The peeled threshold is constant between grid values (v_j = 2^j) and larger at smaller alpha."""
    assert freedman_threshold(3.0, 0.05) == freedman_threshold(4.0, 0.05) < freedman_threshold(4.5, 0.05)
    assert freedman_threshold(10.0, 1e-6) > freedman_threshold(10.0, 0.05)


# ------------------------------------------------------------------------------ broken tests, rejected


@pytest.mark.parametrize(
    ("broken", "runs", "n", "p"),
    [
        # one-sided z at 1.64 on 20 events of probability 0.01: one hit rejects (P = 1 - 0.99**20 = 0.18)
        (lambda: CltZTest(1.64, two_sided=False), 2000, 20, 0.01),
        # two-sided z at 1.96 looked at after every one of 400 events: optional stopping inflates the level
        (lambda: CltZTest(1.96, two_sided=True), 1000, 400, 0.3),
    ],
    ids=["clt-one-sided-small-n-rare", "clt-two-sided-optional-stopping"],
)
def test_meta_test_rejects_a_clt_z_test(broken: Callable[[], SequentialTest], runs: int, n: int, p: float) -> None:
    """The same meta-test rejects a level-0.05 CLT z-test where its approximation breaks, and accepts
    Freedman's test on the same simulated runs."""
    rng = np.random.default_rng(31)
    probabilities = np.full((runs, n), p)
    happened = rng.random((runs, n)) < probabilities
    with pytest.raises(AssertionError, match=r"is not level 0\.05"):
        assert_false_fails_within(rejections(broken, probabilities, happened), runs, ALPHA)
    assert_false_fails_within(rejections(freedman(), probabilities, happened), runs, ALPHA)
