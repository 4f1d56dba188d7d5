"""The sampled runs reach what docs/contract.md ("Sampling") says they check: emitted ids that are not
tokens, EOS ids on sampled runs, seeds on every configuration, and suite drafts that reach every
draft position. The zoo members of these classes are rejected on their ids by ``test_zoo.py``; here
the pieces are tested directly, and the correct-but-different implementations accepted.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import pytest

from _shared_runs import SharedRuns
from specproof.conformance import _registry as registry
from specproof.conformance import certify
from specproof.conformance._sampled_runs import SampledConfig, SampledRun, SampledSearch, _one, score
from specproof.conformance.checks import sampling as sampling_checks
from specproof.contract import Generation, SamplingParams
from specproof.plugins import load_target

SAMPLING = "temperature=0.8,top_p=0.95"
PARAMS = SamplingParams(temperature=0.8, top_p=0.95)


def _config() -> SampledConfig:
    return SampledConfig(name="own-drafts", scheme=None, drafts="own", tests={})


def _run(generate: Any, prompt: tuple[int, ...] = (3, 1, 4), seed: int = 7) -> SampledRun:
    return _one(_config(), generate, None, list(prompt), seed, PARAMS, 4)


# ------------------------------------------------------------------ ids that are not tokens


def test_an_id_with_a_fractional_part_is_refused_not_truncated() -> None:
    assert Generation(tokens=np.array([1.0, 2.0]), stop_reason="eos").tokens == (1, 2)
    with pytest.raises(ValueError, match=r"token 1 is 2\.5, not an integer token id"):
        Generation(tokens=[1, 2.5], stop_reason="eos")


@pytest.mark.parametrize("bad", [64, -1])
def test_an_out_of_vocabulary_id_is_a_support_violation_naming_engine_request_and_token(bad: int) -> None:
    oracle = load_target("reference")
    vocab = oracle.vocab_size
    token = vocab if bad == 64 else -1
    run = _run(lambda prompt, n, params, eos: Generation(tokens=[5, token, 6], stop_reason="max_new_tokens"))
    scored = score(oracle, run, PARAMS)  # never fed to the oracle: no IndexError
    assert scored.bad_token is not None and scored.bad_token[:2] == (1, token) and scored.p is None
    config = _config()
    config.runs.append(scored)
    search = SampledSearch(params=PARAMS, configs=[config], engine="my-engine")
    support = registry.get("engine.sampled-support")
    violations, exercised, _ = sampling_checks.check_sampled_support(support, search, tolerance=0.0)
    assert exercised == 1 and len(violations) == 1
    (v,) = violations
    assert v.invariant == "engine.sampled-support"
    assert "the engine my-engine emitted an id outside the vocabulary on the request with seed 7" in v.explanation
    assert f"token 1 of the output is {token}, not a token id in [0, {vocab})" in v.explanation
    assert v.example["prompt"] == [3, 1, 4] and v.example["seed"] == 7 and v.example["token"] == token
    assert v.example["engine"] == "my-engine"
    # every other sampling check fails naming the same cause, never an error
    for other in ("engine.sampled-distribution", "engine.seeds", "engine.sampled-rounds"):
        (found,) = sampling_checks._errors(registry.get(other), search)
        assert "emitted an id outside the vocabulary" in found.explanation


def test_a_result_that_is_not_a_generation_is_named() -> None:
    run = _run(lambda prompt, n, params, eos: {"tokens": [1, 2]})
    assert run.generation is None and run.error == "generate returned dict, not a specproof.engine.Generation"


def test_a_non_integer_id_fails_the_sampled_checks_naming_it() -> None:
    run = _run(lambda prompt, n, params, eos: Generation(tokens=[1, 2.5], stop_reason="max_new_tokens"))
    assert run.error == "ValueError: token 1 is 2.5, not an integer token id"


@pytest.mark.slow
def test_a_greedy_out_of_vocabulary_id_is_a_lossless_violation_naming_engine_request_and_token(
    shared_runs: SharedRuns,
) -> None:
    spec = "specproof.conformance.zoo:leaks_placeholder_id"
    # the run test_zoo.py rejects the member with: made once a session
    report = shared_runs.certify("engine", engine=spec, only=("engine.lossless",)).to_json()
    (result,) = report["results"]
    assert result["status"] == "fail"
    (v,) = result["violations"]
    assert "LeaksPlaceholderId" in v["explanation"]
    assert "emitted an id outside the vocabulary: token" in v["explanation"]
    assert "of the output is -1, not a token id in [0, 64)" in v["explanation"]
    assert {"prompt", "max_new_tokens", "eos_token_id", "tokens"} <= set(v["example"])


# ------------------------------------------------------------------ EOS ids on sampled runs


def test_the_eos_id_is_a_token_kept_inside_a_drafted_block() -> None:
    from specproof.conformance._sampled_runs import DraftCall, eos_for

    config = _config()
    # round 0 drafted [7, 9, 2] at context length 3: 7 and 9 kept (each followed by more of the round), 2 not
    gen = Generation(tokens=(7, 9, 5, 9), stop_reason="max_new_tokens")
    config.runs.append(
        SampledRun(
            config="c", prompt=(3, 1, 4), seed=0, max_new_tokens=4, generation=gen, calls=(DraftCall(3, (7, 9, 2)),)
        )
    )
    assert eos_for(config, [3, 1, 4]) == 7  # the first kept one (ties: the first counted)
    assert eos_for(config, [1]) is None  # no generation on that prompt yet
    bare = _config()
    bare.runs.append(SampledRun(config="c", prompt=(1,), seed=0, max_new_tokens=4, generation=gen))
    assert eos_for(bare, [1]) == 9  # no drafts, no steps: the engine's most frequent token


def test_the_stop_rule_is_judged_on_sampled_runs_given_an_eos_id() -> None:
    from specproof.contract import Step

    config = _config()
    step = Step(base=2, draft=(7, 9), argmax=(7, 9, 4), accepted=(7, 9, 4), processed=5)
    after_eos = Generation(tokens=(7, 9, 4), stop_reason="eos", steps=(step,))
    config.runs.append(SampledRun(config="c", prompt=(3, 1, 4), seed=3, max_new_tokens=8, generation=after_eos, eos=7))
    search = SampledSearch(params=PARAMS, configs=[config], engine="e")
    rounds = registry.get("engine.sampled-rounds")
    violations, exercised, notes = sampling_checks.check_sampled_rounds(rounds, search, k=4, rollback=None)
    assert exercised == 1 and violations
    assert "follow the first EOS (7)" in violations[0].explanation
    assert violations[0].example["eos_token_id"] == 7 and violations[0].example["seed"] == 3
    assert (
        "the stop rule judged on 1 generations given an EOS id; EOS emitted in 1, kept inside a drafted "
        "block (more of its round after it) in 1 rounds" in notes[0]
    )
    # the correct cut: nothing after the EOS, stop reason eos
    config.runs[0] = attrs.evolve(
        config.runs[0], generation=Generation(tokens=(7,), stop_reason="eos", steps=(attrs.evolve(step, processed=3),))
    )
    violations, _, _ = sampling_checks.check_sampled_rounds(rounds, search, k=4, rollback=None)
    assert violations == []


# ------------------------------------------------------------------ drafts that reach every position


def test_suite_drafts_from_p_are_a_function_of_the_context() -> None:
    """A draft drawn from p with uniforms seeded by the context is the same whenever the context is: its q is
    one-hot, so the draft event's probability stays p(d)."""
    from specproof.conformance._sampled_runs import SuiteSamplingDrafter, _draws_from_p

    contexts = [[*[5, 9, 2, 7][:n], t] for n in range(1, 4) for t in range(8)]
    from_p = [c for c in contexts if _draws_from_p(c)]
    assert 0.5 < len(from_p) / len(contexts) < 0.9
    one = SuiteSamplingDrafter(load_target("reference"), params=PARAMS)
    two = SuiteSamplingDrafter(load_target("reference"), params=PARAMS)
    first = [one.propose(c, 4) for c in from_p]
    assert first == [two.propose(c, 4) for c in reversed(from_p)][::-1]
    assert all(len(d) == 4 for d in first)


def test_reach_counts_each_draft_position_whose_earlier_tokens_were_kept() -> None:
    from specproof.conformance._sampled_runs import DraftCall, _last_draft_positions, count_reach

    config = _config()
    gen = Generation(tokens=(7, 9, 2, 8, 6), stop_reason="max_new_tokens")
    run = SampledRun(
        config="c",
        prompt=(3,),
        seed=0,
        max_new_tokens=5,
        generation=gen,
        # a full block [7, 9, 2] (then the bonus 8), and a draft [5, 1] rejected at 0 (6 emitted)
        calls=(DraftCall(1, (7, 9, 2)), DraftCall(5, (5, 1))),
    )
    count_reach(config, run)
    assert config.drafted == [2, 2, 1] and config.reached == [2, 1, 1]
    assert _last_draft_positions(run.calls, [3, *gen.tokens]) == {3}


@pytest.mark.slow
def test_the_builtin_stack_reaches_the_last_draft_position_and_eos_inside_blocks(shared_runs: SharedRuns) -> None:
    # the run test_sampling.py passes the built-in stack's sampling checks with (this one among them, its
    # rows the same as in a run of it alone): made once a session
    report = shared_runs.certify(
        "engine", only=("engine.sampled*", "engine.seeds", "engine.greedy-limit"), sampling=SAMPLING
    ).to_json()
    rows = [r for r in report["results"] if r["invariant"] == "engine.sampled-rounds"]
    notes = " ".join(n for r in rows for n in r["notes"])
    assert rows and all(r["status"] == "pass" for r in rows), rows
    import re

    last = [int(m) for m in re.findall(r"were reached in 100%, \d+%, \d+%, (\d+)%", notes)]
    assert last and min(last) >= 10, notes
    inside = [int(m) for m in re.findall(r"kept inside a drafted block \(more of its round after it\) in (\d+)", notes)]
    assert inside and min(inside) > 0, notes


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["specproof.conformance.zoo:sampling_drafter", "model:trained-small"])
def test_sampling_drafters_that_draw_with_the_rng_they_are_given_pass_the_seed_check(
    drafter: str, shared_runs: SharedRuns
) -> None:
    """The control of ``drafter_ignores_rng``: the seeds are asked again on the drafter's own configuration."""
    if drafter.startswith("model:"):  # the run test_sampling.py certifies the draft model with, the seeds among
        # its checks (each check's rows are those of a run of it alone): made once a session
        only = ("engine.seeds", "engine.sampled-distribution", "drafter.proposal-distribution")
        report = shared_runs.certify(drafter=drafter, target="trained", only=only, sampling=SAMPLING).to_json()
    else:
        report = certify("drafter", drafter=drafter, only=("engine.seeds",), sampling=SAMPLING).to_json()
    assert report["verdict"] == "pass", [r["detail"] for r in report["results"]]
    seeds = [r for r in report["results"] if r["invariant"] == "engine.seeds"]
    notes = " ".join(n for r in seeds for n in r["notes"])
    assert "rejection/own-drafts" in notes
    assert seeds and all(r["exercised"] > 0 for r in seeds)


@pytest.mark.slow
def test_an_engine_handing_its_drafter_the_request_rng_passes_the_seed_check_on_sampled_drafts() -> None:
    """The control of ``unseeded_drafter_rng``: the same engine with the request's generator."""
    spec = "specproof.conformance.zoo:sampling_engine"
    report = certify("engine", engine=spec, only=("engine.seeds",), sampling=SAMPLING).to_json()
    (result,) = report["results"]
    assert result["status"] == "pass" and "suite-sampled-drafts" in " ".join(result["notes"])
