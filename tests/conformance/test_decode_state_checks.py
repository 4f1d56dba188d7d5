"""The decode-state checks (docs/contract.md, "Decode state"): each zoo member from a public report rejected at
quick on its id, the correct variants accepted with every check exercised, the built-in stack certified, and an
engine that declares no decode_features skipped, saying why (so every engine certifiable before still is)."""

from __future__ import annotations

import pytest

from _shared_runs import SharedRuns
from specproof.conformance import REGISTRY, certify
from specproof.conformance.zoo import CONTROLS, CORRECT_DECODE, ZOO

pytestmark = pytest.mark.slow  # a certification of a few seconds per test

DECODE_IDS = tuple(inv.id for inv in REGISTRY if inv.driver == "decode-state")
MEMBERS = sorted(name for name, member in ZOO.items() if member.invariant in DECODE_IDS)


def test_there_is_a_check_per_kind_and_a_member_per_check() -> None:
    assert set(DECODE_IDS) == {
        "decode.penalties",
        "decode.min-tokens",
        "decode.stop",
        "decode.processor-state",
        "decode.grammar",
        "decode.grammar-sampled",
        "decode.logprobs",
        "decode.parameter-parity",
        "decode.stop-strings",
        "decode.sampled",
        "decode.session",
        "decode.prompt-logprobs",
    }
    assert {ZOO[m].invariant for m in MEMBERS} == set(DECODE_IDS)


@pytest.mark.parametrize("name", MEMBERS)
def test_every_decode_member_is_rejected_at_quick_on_its_id(name: str, shared_runs: SharedRuns) -> None:
    member = ZOO[name]
    # the very run test_zoo.py rejects the member with: made once a session
    report = shared_runs.certify("engine", engine=member.spec, only=(member.invariant,), decode_state=True).to_json()
    [result] = report["results"]
    assert result["status"] == "fail", result
    assert all(v["invariant"] == member.invariant for v in result["violations"])
    assert "decode" in result["violations"][0]["example"], result["violations"][0]


@pytest.mark.parametrize("name", sorted(CORRECT_DECODE))
def test_correct_decode_engines_are_accepted_with_every_check_exercised(name: str) -> None:
    report = certify("engine", engine=CORRECT_DECODE[name], only=("decode.*",), decode_state=True).to_json()
    assert {r["invariant"]: r["status"] for r in report["results"]} == dict.fromkeys(DECODE_IDS, "pass")
    assert all(r["exercised"] > 0 for r in report["results"]), report["results"]


def test_the_builtin_stack_passes_at_both_rollbacks(shared_runs: SharedRuns) -> None:
    # test_decode_session_check.py reads this run's decode.session rows: made once a session
    report = shared_runs.certify("engine", only=("decode.*",), decode_state=True).to_json()
    assert len(report["results"]) == 2 * len(DECODE_IDS)
    assert {r["status"] for r in report["results"]} == {"pass"}, report["results"]
    assert all(r["exercised"] > 0 for r in report["results"])


def test_without_the_option_the_checks_skip_saying_how_to_run_them() -> None:
    report = certify("engine", only=("decode.stop",)).to_json()
    assert {r["status"] for r in report["results"]} == {"skip"}
    assert all("--decode-state" in r["detail"] for r in report["results"]), report["results"]


def test_an_engine_that_declares_no_decode_features_is_skipped_saying_why() -> None:
    """...except on parameter parity, which every engine with a model faces: the control has no ``decode``
    keyword, so it refuses every parameter, and refusing is allowed."""
    report = certify("engine", engine=CONTROLS["engine"], only=("decode.*",), decode_state=True).to_json()
    assert {r["status"] for r in report["results"]} == {"skip"}
    parity = [r for r in report["results"] if r["invariant"] == "decode.parameter-parity"]
    others = [r for r in report["results"] if r["invariant"] != "decode.parameter-parity"]
    assert all("declares no decode_features" in r["detail"] for r in others), report["results"]
    assert [r["detail"].startswith("the engine refused") for r in parity] == [True], parity
    assert report["verdict"] != "fail"


def test_a_placeholder_logprob_is_named_as_one() -> None:
    """llama.cpp #27972's shape: every logprob 0.0 (a deterministic drafter's one-hot q, all blocks accepted)."""
    report = certify(
        "engine", engine=ZOO["logprobs_from_drafter"].spec, only=("decode.logprobs",), decode_state=True
    ).to_json()
    [result] = report["results"]
    assert result["status"] == "fail"
    assert "teacher-forced scoring after the processors" in result["violations"][0]["explanation"]


def test_parity_names_a_silently_ignored_parameter() -> None:
    member = ZOO["frequency_penalty_ignored"]
    report = certify("engine", engine=member.spec, only=("decode.*",), decode_state=True).to_json()
    by_id = {r["invariant"]: r for r in report["results"]}
    assert by_id["decode.parameter-parity"]["status"] == "fail"
    assert "silently ignored" in by_id["decode.parameter-parity"]["violations"][0]["explanation"]
    # it declares no decode_features, so nothing else judges it: parity is what catches it
    assert {r["status"] for i, r in by_id.items() if i != "decode.parameter-parity"} == {"skip"}


def test_sample_and_match_under_decode_parameters_passes_the_sampled_check() -> None:
    report = certify(
        "engine", engine=CORRECT_DECODE["decode_match_scheme"], only=("decode.sampled",), decode_state=True
    )
    [result] = report.to_json()["results"]
    assert result["status"] == "pass" and result["exercised"] > 0, result


def test_a_refused_logprobs_request_is_skipped_not_an_error() -> None:
    """An engine refusing one request (vLLM: a stop sequence longer than one token beside logprobs) is a skip
    with its reason; the check once asserted a generation and errored."""
    from specproof.conformance._registry import get
    from specproof.conformance.checks.decode_logprobs import check_logprobs
    from specproof.conformance.checks.decode_state import DecodeExample, DecodeRun
    from specproof.contract import DecodeParams, Generation

    example = DecodeExample(kind="logprobs", prompt=(1,), max_new_tokens=2, params=DecodeParams(logprobs=0),
                            eos_token_id=None, schedule=())  # fmt: skip
    plain = Generation(tokens=(3, 4), stop_reason="max_new_tokens")
    run = DecodeRun(example=example, expected=plain, baseline=plain, generation=None, error=None, states=None,
                    refused="vllm: stop [4, 5] is a sequence of 2 tokens")  # fmt: skip
    assert check_logprobs(get("decode.logprobs"), run, None) == ([], 0, run.refused)  # type: ignore[arg-type]
