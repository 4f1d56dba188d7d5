"""``decode.prompt-logprobs`` (docs/contract.md, "Decode state", "Prompt logprobs"): the off-by-one member rejected
at quick on its id, the float32 variant accepted at quick and ci, and an engine that returns no prompt logprobs
(declares no ``prompt_logprobs``) skipped, saying so. The engines here are loaded as
``test_decode_prompt_logprobs_check:NAME``."""

from __future__ import annotations

import pytest

from _shared_runs import SharedRuns
from specproof.conformance import certify
from specproof.conformance.zoo import CORRECT_DECODE, ZOO
from specproof.conformance.zoo._decode_engines import DecodeZooEngine

pytestmark = pytest.mark.slow  # a certification of a few seconds per test

CHECK = "decode.prompt-logprobs"


class _NoPromptLogprobs(DecodeZooEngine):
    decode_features = tuple(f for f in DecodeZooEngine.decode_features if f != "prompt_logprobs")


def _results(engine: str, profile: str = "quick") -> list[dict[str, object]]:
    report = certify("engine", engine=engine, only=(CHECK,), decode_state=True, profile=profile).to_json()
    return list(report["results"])


def test_prompt_logprobs_off_by_one_is_rejected_at_quick_naming_the_prompt_token(shared_runs: SharedRuns) -> None:
    # the very run test_zoo.py rejects the member with: made once a session
    spec = ZOO["prompt_logprobs_off_by_one"].spec
    [result] = shared_runs.certify("engine", engine=spec, only=(CHECK,), decode_state=True).to_json()["results"]
    assert result["status"] == "fail" and result["invariant"] == CHECK
    assert "prompt token" in result["violations"][0]["explanation"], result["violations"][0]


@pytest.mark.parametrize("profile", ["quick", "ci"])
def test_prompt_logprobs_in_float32_are_accepted(profile: str) -> None:
    [result] = _results(CORRECT_DECODE["prompt_logprobs_float32"], profile)
    assert result["status"] == "pass" and result["exercised"] > 0, result


def test_an_engine_that_returns_no_prompt_logprobs_is_skipped_saying_so() -> None:
    [result] = _results("test_decode_prompt_logprobs_check:_NoPromptLogprobs")
    assert result["status"] == "skip" and "prompt_logprobs" in str(result["detail"]), result
