"""The sampled runs reach what docs/contract.md ("Sampling") says they check: emitted ids that are not
tokens, EOS ids on sampled runs, seeds on every configuration, and suite drafts that reach every
draft position. The zoo members of these classes are rejected on their ids by ``test_zoo.py``; here
the pieces are tested directly, and the correct-but-different implementations accepted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

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
    run = _run(lambda prompt, n, params: Generation(tokens=[5, token, 6], stop_reason="max_new_tokens"))
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
    run = _run(lambda prompt, n, params: {"tokens": [1, 2]})
    assert run.generation is None and run.error == "generate returned dict, not a specproof.engine.Generation"


def test_a_non_integer_id_fails_the_sampled_checks_naming_it() -> None:
    run = _run(lambda prompt, n, params: Generation(tokens=[1, 2.5], stop_reason="max_new_tokens"))
    assert run.error == "ValueError: token 1 is 2.5, not an integer token id"


@pytest.mark.slow
def test_a_greedy_out_of_vocabulary_id_is_a_lossless_violation_naming_engine_request_and_token() -> None:
    spec = "specproof.conformance.zoo:leaks_placeholder_id"
    report = certify("engine", engine=spec, only=("engine.lossless",)).to_json()
    (result,) = report["results"]
    assert result["status"] == "fail"
    (v,) = result["violations"]
    assert "LeaksPlaceholderId" in v["explanation"]
    assert "emitted an id outside the vocabulary: token" in v["explanation"]
    assert "of the output is -1, not a token id in [0, 64)" in v["explanation"]
    assert {"prompt", "max_new_tokens", "eos_token_id", "tokens"} <= set(v["example"])
