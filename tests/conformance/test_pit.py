"""Meta-tests of the all-token distribution test (``_pit``: randomized PIT, DKW-Massart at fixed checkpoints).

Simulated first (numpy Generators with fixed seeds: every figure is deterministic): the PIT of tokens
drawn from ``p`` is uniform, the test's level holds when it looks at every checkpoint, a test that
looks as often with the fixed-sample bound is rejected by the same meta-test, and a law at the
stated ``min_detectable`` is rejected as often as claimed. Then the sampled search end to end: a
deviation just under quick's sensitivity that stopping at the sensitivity missed is rejected once
the budget is spent, and an engine that samples by another algorithm (Gumbel-max) is accepted.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from _shared_runs import SharedRuns
from specproof.conformance._pit import CHECKPOINTS, PitTest, checkpoint, kolmogorov_distance, pit_values, threshold
from specproof.conformance._sampled_runs import TESTS_PER_CONFIGURATION
from specproof.conformance.zoo._sampling_deviations import deviate

ALPHA = 0.05  # large, so false fails are observable (the check uses 1e-6 split over its tests)
SAMPLING = "temperature=0.8,top_p=0.95"


def binomial_upper(runs: int, rate: float, tail: float = 1e-6) -> int:
    """The smallest ``c`` with ``P(Binomial(runs, rate) > c) <= tail``."""
    scipy_stats = pytest.importorskip("scipy.stats")
    return int(scipy_stats.binom.isf(tail, runs, rate))


def draw(rng: np.random.Generator, rows: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(rows, axis=1)
    return np.minimum((rng.random((len(rows), 1)) > cdf).sum(axis=1), rows.shape[1] - 1)


# ------------------------------------------------------------------------------ the transform


def test_the_pit_of_tokens_drawn_from_p_is_uniform_and_the_statistic_is_scipys() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(40)
    rows = rng.dirichlet(np.full(12, 0.3), size=8000)
    rows[:2000] = np.eye(12)[rng.integers(0, 12, 2000)]  # one-hot rows: u is V itself
    u = pit_values(rows, draw(rng, rows), seed=3)
    assert ((0.0 <= u) & (u < 1.0)).all()
    result = scipy_stats.kstest(u, "uniform")
    assert result.pvalue > 1e-3
    assert kolmogorov_distance(u)[0] == pytest.approx(result.statistic, abs=1e-12)


def test_the_pit_orders_by_p_descending_with_the_lower_id_first() -> None:
    row = np.array([[0.2, 0.5, 0.2, 0.1]])  # order: 1, 0, 2, 3
    v = np.random.default_rng([0x50_49_54, 0]).random(1)[0]
    assert pit_values(row, [2], seed=0)[0] == pytest.approx(0.7 + v * 0.2)
    assert pit_values(row, [1], seed=0)[0] == pytest.approx(v * 0.5)


def test_a_bad_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="3 tokens for p of shape"):
        pit_values(np.full((2, 4), 0.25), [0, 1, 2], seed=0)


# ------------------------------------------------------------------------------ level and power


class FixedNLooks:
    """A broken test: DKW at ``alpha`` (no share for the other looks) checked at every checkpoint."""

    def __init__(self, alpha: float) -> None:
        self.alpha, self.values, self.rejected, self.reached = alpha, np.zeros(0), False, 0

    def add(self, u: np.ndarray) -> None:
        self.values = np.concatenate([self.values, u])
        while checkpoint(self.reached) <= len(self.values):
            n = checkpoint(self.reached)
            self.reached += 1
            if kolmogorov_distance(self.values[:n])[0] > math.sqrt(math.log(2 / self.alpha) / (2 * n)):
                self.rejected = True


def false_fails(make: object, runs: int, generations: int, length: int, seed: int) -> int:
    """How many of ``runs`` null runs (``generations`` of ``length`` tokens, fed a generation at a time)
    the test rejects."""
    rng = np.random.default_rng(seed)
    count = 0
    for _ in range(runs):
        test = make()  # type: ignore[operator]
        for _ in range(generations):
            test.add(rng.random(length))
            if test.rejected:
                count += 1
                break
    return count


@pytest.mark.slow
def test_false_fail_rate_when_looking_at_every_checkpoint_is_at_most_alpha() -> None:
    runs = 1000
    found = false_fails(lambda: PitTest(name="t", alpha=ALPHA), runs, generations=60, length=24, seed=41)
    assert found <= binomial_upper(runs, ALPHA), f"{found} false fails in {runs} null runs"


@pytest.mark.slow
def test_the_meta_test_rejects_the_fixed_sample_bound_used_at_every_look() -> None:
    """The same meta-test catches a test that spends ``alpha`` at every checkpoint (optional stopping)."""
    runs = 1000
    found = false_fails(lambda: FixedNLooks(ALPHA), runs, generations=60, length=24, seed=41)
    assert found > binomial_upper(runs, ALPHA)


def test_a_law_at_min_detectable_is_rejected_with_power_099() -> None:
    """iid draws from ``(1 - c) U(0, 1) + c U(0, 1/2)``, at Kolmogorov distance ``c / 2`` = ``min_detectable``:
    rejected in at least 99% of runs (DKW on the alternative makes it exact), less the simulation's margin."""
    sizing = PitTest(name="t", alpha=1e-6)
    sizing.add(np.zeros(2000))
    c = 2 * sizing.min_detectable
    rng = np.random.default_rng(42)
    runs, rejected = 400, 0
    for _ in range(runs):
        test = PitTest(name="t", alpha=1e-6)
        u = rng.random(2000)
        test.add(np.where(rng.random(2000) < c, u / 2, u))
        rejected += test.rejected
    assert rejected >= 0.97 * runs, f"{rejected} of {runs} rejected a law at distance {c / 2:.3f}"
    assert test.signed > 0 and "sharper" in test.direction()


def test_checkpoints_and_thresholds() -> None:
    assert checkpoint(0) == 32 and checkpoint(1) == 36 and checkpoint(CHECKPOINTS - 1) > 5_000_000
    assert threshold(1000, 1e-6) == pytest.approx(math.sqrt(math.log(2 * CHECKPOINTS / 1e-6) / 2000))
    test = PitTest(name="t", alpha=1e-6)
    assert test.tested == 0 and test.min_detectable == math.inf and "nothing tested" in test.describe()
    test.add(np.random.default_rng(44).permutation(np.linspace(0, 1, 100, endpoint=False)))
    assert test.tested == max(checkpoint(j) for j in range(CHECKPOINTS) if checkpoint(j) <= 100)


def test_a_deviation_no_event_sees_is_rejected_by_the_pit() -> None:
    """``p`` uniform on 10 tokens; the engine moves 0.08 from token 1 to token 4. The top token (0), the head
    (tokens 0-4) and the tail (token 9) keep their mass, so the event tests, at the same level, stay within
    their bounds over 5000 tokens; the PIT's law moves by 0.08 between 0.2 and 0.4 and is rejected."""
    from specproof.conformance._sampled_runs import head_and_tail
    from specproof.conformance._sequential import EventTest

    p = np.full(10, 0.1)
    engine = p.copy()
    engine[1], engine[4] = 0.02, 0.18
    head, tail = head_and_tail(p)
    rng = np.random.default_rng(45)
    tokens = rng.choice(10, size=5000, p=engine)
    events = {
        "top": (np.arange(10) == 0, 0.1),
        "head": (head, float(p[head].sum())),
        "tail": (tail, float(p[tail].sum())),
    }
    for name, (mask, pi) in events.items():
        test = EventTest(name=name, summary=name, alpha=1e-7)
        for token in tokens:
            test.add(bool(mask[token]), pi)
        assert not test.rejected, name
    pit = PitTest(name="pit", alpha=1e-7)
    for start in range(0, 5000, 40):  # generations of 40 tokens
        pit.add(pit_values(np.tile(p, (40, 1)), tokens[start : start + 40], seed=start))
    assert pit.rejected and pit.distance == pytest.approx(0.08, abs=0.03)


# ------------------------------------------------------------------------------ the deviations


@pytest.mark.parametrize("shape", ["sharper", "flatter"])
def test_a_deviation_moves_exactly_its_total_variation(shape: str) -> None:
    rng = np.random.default_rng(43)
    for row in rng.dirichlet(np.full(10, 0.5), size=200):
        out = deviate(row, 0.04, shape)
        room = 1.0 - row.max() if shape == "sharper" else row.max()
        assert 0.5 * np.abs(out - row).sum() == pytest.approx(min(0.04, room))
        assert out.sum() == pytest.approx(1.0) and not ((row == 0) & (out > 0)).any()
    one_hot = np.eye(10)[3]
    assert (deviate(one_hot, 0.04, shape) == one_hot).all()


# ------------------------------------------------------------------------------ end to end


def _search(spec: str, generations: int) -> object:
    from specproof.conformance._plan import Plan
    from specproof.conformance._sampled_runs import run_sampled_search

    plan = Plan.create(subject="engine", engine=spec, sampling=SAMPLING)
    plan = attrs.evolve(plan, profile=attrs.evolve(plan.profile, sampling_generations=generations))
    return run_sampled_search(
        plan.suite.engines[0],
        target=plan.suite.target,
        drafter_subject=plan.suite.drafter,
        params=plan.sampling,
        profile=plan.profile,
        seed=0,
        alpha=1e-6,
    )


def _stopped_at_the_sensitivity(config: object, tv_target: float) -> bool:
    """What the former stopping rule decided on the same runs: draw until the primary event test detects
    ``tv_target`` (at least 8 generations), stop early at a rejection; True when it rejected."""
    from specproof.conformance._sampled_runs import add_events, new_config

    replay = new_config("replay", scheme=config.scheme, drafts=config.drafts, alpha=config.tests["top"].alpha)  # type: ignore[attr-defined]
    for drawn, run in enumerate(config.runs, start=1):  # type: ignore[attr-defined]
        add_events(replay, run)
        if any(t.rejected for t in replay.tests.values()):
            return True
        if drawn >= 8 and replay.primary.min_detectable <= tv_target:
            return False
    return False


@pytest.mark.slow
def test_a_deviation_under_the_sensitivity_is_rejected_once_the_budget_is_spent() -> None:
    """A flattening of 0.15 TV (quick detects 0.2): stopping at quick's sensitivity missed it in every
    configuration; spending a budget of 48 generations rejects it."""
    from specproof.conformance._registry import REGISTRY
    from specproof.conformance.checks.sampling import check_sampled_distribution

    search = _search("specproof.conformance.zoo._sampling_deviations:flatter_015", 48)
    assert not any(_stopped_at_the_sensitivity(c, 0.2) for c in search.configs)  # type: ignore[attr-defined]
    assert any(c.rejected for c in search.configs)  # type: ignore[attr-defined]
    inv = next(i for i in REGISTRY if i.id == "engine.sampled-distribution")
    violations, _, _ = check_sampled_distribution(inv, search, tv_target=0.2)  # type: ignore[arg-type]
    assert violations and "seeds 0.." in violations[0].explanation


@pytest.mark.slow
def test_an_engine_that_samples_by_another_algorithm_is_accepted() -> None:
    """Gumbel-max draws and log-space acceptance: other tokens per seed than the zoo's sampler, the same
    distribution; no test of any configuration rejects it at the same budget."""
    gumbel = _search("specproof.conformance.zoo._sampling_deviations:gumbel_engine", 48)
    plain = _search("specproof.conformance.zoo:sampling_engine", 4)
    assert not any(c.rejected for c in gumbel.configs)  # type: ignore[attr-defined]
    first = [r.generation.tokens for r in gumbel.configs[0].runs[:4]]  # type: ignore[attr-defined]
    assert first != [r.generation.tokens for r in plain.configs[0].runs[:4]]  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_report_gives_the_checks_bound_split_per_configuration(shared_runs: SharedRuns) -> None:
    """The JSON result's ``statistics`` (schema-valid) and the certificate's text both say the bound is the
    check's on its engine case, the sum of its configurations' shares."""
    from specproof.conformance.reports import render_markdown
    from specproof.formats.report import FORMAT

    # the run test_sampling.py's certificate tests read too: made once a session
    report = shared_runs.certify(only=("engine.sampled-distribution",), sampling=SAMPLING).to_json()
    assert FORMAT.validate(report) == []
    for result in report["results"]:
        stats = result["statistics"]
        assert stats["scope"] == "check" and stats["false_fail_bound"] == pytest.approx(1e-6)
        shares = [c["false_fail_bound"] for c in stats["configurations"]]
        assert len(shares) == 3 and sum(shares) == pytest.approx(1e-6)
        for config in stats["configurations"]:
            assert config["false_fail_bound"] == pytest.approx(sum(t["alpha"] for t in config["tests"]))
            (pit,) = [t for t in config["tests"] if t["kind"] == "pit"]
            assert pit["n"] > 0 and not pit["rejected"] and pit["kolmogorov_distance"] < pit["threshold"]
        assert len(result["notes"]) == 3
        tests = f"({TESTS_PER_CONFIGURATION} tests)"
        assert all(f"this configuration's false-fail bound 3.3e-07 {tests}" in n for n in result["notes"])
    text = render_markdown(report)
    assert (
        "- `engine.sampled-distribution` (checkpoint): false-fail bound 1e-06 for the check on this engine case, "
        "split over its configurations: rejection/suite-drafts 3.3e-07, match/suite-drafts 3.3e-07, "
        "rejection/suite-sampled-drafts 3.3e-07"
    ) in text
    assert "for this check" not in text
