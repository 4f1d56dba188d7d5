"""The sampling checks end to end: correct variants pass with every check exercised, options are
validated before anything runs, the certificate states the bound and the sensitivity, and a run
that cannot reach its sensitivity is a skip (docs/contract.md, "Sampling").

Each zoo member is rejected on its invariant by ``test_zoo.py``; here the correct-but-different
implementations are accepted (both schemes, both rollbacks, a drafter with a declared q, the
n-gram drafter, engines over the wire).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from _shared_runs import SharedRuns
from specproof.cli import main
from specproof.conformance import certify
from specproof.conformance._plan import Plan
from specproof.conformance._profiles import PROFILES
from specproof.conformance._sampled_runs import SuiteSamplingDrafter, add_events, new_config, run_sampled_search
from specproof.contract import SamplingParams, UsageError
from specproof.plugins import load_target

pytestmark = pytest.mark.slow

SAMPLING = "temperature=0.8,top_p=0.95"
ENGINE_CHECKS = (
    "engine.sampled-distribution",
    "engine.sampled-support",
    "engine.sampled-rounds",
    "engine.seeds",
    "engine.greedy-limit",
)
PY_ENGINE = Path(__file__).resolve().parents[1] / "_wire_py_engine.py"


def _results(report: Any) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in report.to_json()["results"]}


def _sampling_results(report: Any) -> list[dict[str, Any]]:
    return [r for r in report.to_json()["results"] if r["invariant"] in ENGINE_CHECKS]


@pytest.mark.parametrize(
    "engine",
    [
        None,  # the built-in stack: both rollbacks, both schemes, deterministic and sampled suite drafts
        "specproof.conformance.zoo:sampling_engine",
        "specproof.conformance.zoo:sampling_engine_match_replay",
        "specproof.conformance.zoo:sampling_engine_own_q",
        f"exec:{sys.executable} {PY_ENGINE} sampling",
    ],
)
def test_correct_sampling_engines_pass_with_every_check_exercised(engine: str | None, shared_runs: SharedRuns) -> None:
    # test_sampled_reach.py reads the built-in stack's engine.sampled-rounds rows of this run: made once a session
    report = shared_runs.certify(
        "engine", engine=engine, only=("engine.sampled*", "engine.seeds", "engine.greedy-limit"), sampling=SAMPLING
    )
    results = _sampling_results(report)
    assert report.verdict == "pass", [(r["id"], r["detail"]) for r in results if r["status"] != "pass"]
    assert results and all(r["status"] == "pass" and r["exercised"] > 0 for r in results)


def test_the_builtin_stack_passes_with_a_sampling_drafter(shared_runs: SharedRuns) -> None:
    """A draft model that samples and declares q: its own configuration, and the drafter check."""
    # test_sampled_reach.py reads this run's engine.seeds rows (each check's rows are those of a run of it
    # alone): made once a session
    report = shared_runs.certify(
        drafter="model:trained-small",
        target="trained",
        sampling=SAMPLING,
        only=("engine.seeds", "engine.sampled-distribution", "drafter.proposal-distribution"),
    )
    results = _results(report)
    assert report.verdict == "pass", {k: v["detail"] for k, v in results.items()}
    notes = " ".join(results["checkpoint-engine.sampled-distribution"]["notes"])
    assert "rejection/own-drafts" in notes and "match/suite-drafts" in notes
    assert results["drafter.proposal-distribution"]["exercised"] > 0


def test_without_sampling_the_checks_are_skips_that_say_why() -> None:
    report = certify(only=("engine.sampled-distribution", "drafter.proposal-distribution"))
    for result in report.to_json()["results"]:
        assert result["status"] == "skip" and "--sampling" in result["detail"]


def test_a_deterministic_drafter_has_nothing_to_declare() -> None:
    report = certify(drafter="ngram", only=("drafter.proposal-distribution",), sampling=SAMPLING)
    (result,) = report.to_json()["results"]
    assert result["status"] == "skip" and "one-hot" in result["detail"]


def test_an_engine_that_does_not_sample_is_a_skip_naming_the_capability() -> None:
    report = certify(
        "engine", engine="specproof.conformance.zoo:zoo_engine", only=("engine.sampled-support",), sampling=SAMPLING
    )
    (result,) = report.to_json()["results"]
    assert result["status"] == "skip" and "`sampling`" in result["detail"]


def test_the_certificate_states_the_bound_and_the_sensitivity(shared_runs: SharedRuns) -> None:
    report = shared_runs.certify(only=("engine.sampled-distribution",), sampling=SAMPLING)
    notes = " ".join(n for r in report.to_json()["results"] for n in r["notes"])
    assert all(r["statistics"]["false_fail_bound"] == pytest.approx(1e-6) for r in report.to_json()["results"])
    assert "this configuration's false-fail bound 3.3e-07" in notes
    detectable = [float(x) for x in __import__("re").findall(r"detects a TV deviation of ([0-9.]+)", notes)]
    assert detectable and max(detectable) <= PROFILES["quick"].sampling_tv


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("temperature=-1", "temperature=-1"),
        ("top_p=0.9", "give temperature"),
        ("temperature=0.8,top_q=1", "top_q=1"),
        ("temperature=0.8,top_k=1.5", "top_k"),
        ("temperature=0.8,seed=3", "takes no seed"),
        ("temperature=0.8,min_p=1", "min_p=1"),
    ],
)
def test_bad_sampling_options_are_usage_errors_before_anything_runs(text: str, message: str, capsys: Any) -> None:
    with pytest.raises(UsageError, match=message):
        Plan.create(sampling=text)
    assert main(["certify", "--sampling", text]) == 2
    assert message in capsys.readouterr().err


def test_a_failure_reproduces_with_its_sampling_options(shared_runs: SharedRuns) -> None:
    spec = "specproof.conformance.zoo:residual_from_p"
    # the run test_zoo.py rejects the member with: made once a session
    report = shared_runs.certify("engine", engine=spec, only=("engine.sampled-support",), sampling=SAMPLING)
    (result,) = report.to_json()["results"]
    assert result["status"] == "fail"
    assert f"--sampling {SamplingParams(temperature=0.8, top_p=0.95).describe()}" in result["reproduce"]


def test_a_run_that_cannot_reach_its_sensitivity_is_a_skip() -> None:
    plan = Plan.create(sampling=SAMPLING)
    tiny = attrs.evolve(plan.profile, sampling_generations=2)
    plan = attrs.evolve(plan, profile=tiny)
    from specproof.conformance._certification import Certification

    cert = Certification(plan)
    items = [i for i in cert.checks("engine") if i.invariant.id == "engine.sampled-distribution"]
    result = cert.run(items[0])
    assert result.status == "skip" and "budget" in result.detail


def test_a_seeded_run_draws_other_generation_seeds() -> None:
    plan = Plan.create(sampling=SAMPLING, seed=7)
    case = plan.suite.engines[0]
    common = dict(
        target=plan.suite.target,
        drafter_subject=plan.suite.drafter,
        params=plan.sampling,
        profile=plan.profile,
        alpha=1e-6,
    )
    seeded = run_sampled_search(case, seed=7, **common)
    derandomized = run_sampled_search(case, seed=0, **common)
    assert seeded.configs[0].runs[0].seed != derandomized.configs[0].runs[0].seed == 0


def test_the_draft_event_has_probability_p_of_the_draft_token_under_both_schemes() -> None:
    """The event the statistical check leans on, computed by hand on one round: for a deterministic
    draft token d the chance it is emitted is p(d) whatever the scheme (a Monte Carlo of 4000 seeds,
    within 4.5 standard errors)."""
    from specproof.engine import SpecDecoder

    target = load_target("reference")
    params = SamplingParams(temperature=1.5)
    prompt = [5, 9, 2]
    drafter = SuiteSamplingDrafter(load_target("reference"))
    draft = drafter.propose(prompt, 1)
    ref = load_target("reference")
    ref.reset()
    from specproof.contract import processed_distribution

    p = processed_distribution(np.asarray(ref.forward(prompt))[-1], params)[draft[0]]
    for scheme in ("rejection", "match"):
        decoder = SpecDecoder(target, SuiteSamplingDrafter(load_target("reference")), k=1, scheme=scheme)
        hits = sum(decoder.generate(prompt, 2, sampling=params.with_seed(s)).tokens[0] == draft[0] for s in range(4000))
        assert abs(hits / 4000 - p) <= 4.5 * np.sqrt(p * (1 - p) / 4000), (scheme, hits / 4000, p)


def test_events_are_scored_only_where_earlier_draft_tokens_were_kept() -> None:
    config = new_config("c", scheme="rejection", drafts="suite", alpha=1e-6)
    from specproof.conformance._sampled_runs import DraftCall, SampledRun
    from specproof.contract import Generation

    vocab = 4
    p = np.full((3, vocab), 0.25)
    run = SampledRun(
        config="c",
        prompt=(1,),
        seed=0,
        max_new_tokens=3,
        generation=Generation(tokens=(2, 3, 0), stop_reason="max_new_tokens"),
        p=p,
        logits=np.zeros((3, vocab)),
        # round 0 drafted [2, 1, 1] at context length 1: 2 kept, 1 rejected (3 emitted), the third never scored
        calls=(DraftCall(1, (2, 1, 1)), DraftCall(3, (0,))),
    )
    add_events(config, run)
    assert config.tests["draft"].n == 3  # positions 1, 2 (round 0) and 3 (round 1)
    assert config.tests["draft"].hits == 2
    assert config.tests["replacement"].n == 1


def test_the_markdown_certificate_has_a_sampling_section(shared_runs: SharedRuns) -> None:
    from specproof.conformance.reports import render_markdown

    report = shared_runs.certify(only=("engine.sampled-distribution",), sampling=SAMPLING).to_json()
    assert report["sampling"] == SamplingParams(temperature=0.8, top_p=0.95).to_json()
    text = render_markdown(report)
    section = text.split("## Sampling (temperature=0.8,top_k=0,top_p=0.95,min_p=0.0)", 1)[1]
    assert "false-fail bound 1e-06" in section and "detects a TV deviation of" in section
    assert "## Sampling" not in render_markdown(certify(only=("engine.stop",)).to_json())
