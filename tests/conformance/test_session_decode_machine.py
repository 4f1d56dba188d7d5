"""Decode parameters in the session machine (docs/contract.md, "Decode state", "In the session machine"): with
``--decode-state`` some of ``engine.session``'s requests carry the processors the engine declares, passed as
``decode=`` and judged against plain decoding with them; the session history records them (an optional
``decode`` object per request) and ``--replay-session`` replays them. A penalty buffer that outlives the request
is rejected there and only there; correct engines pass; without the option nothing is drawn."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main
from specproof.conformance import certify
from specproof.contract import DecodeParams
from specproof.strategies import SessionHistory, SessionMachine, _session_requests
from specproof.strategies._contexts import StrategyArgumentError

ZOO = "specproof.conformance.zoo"
MEMBER = f"{ZOO}:session_penalties_carried_over"
CORRECT = f"{ZOO}:decode_session_engine"
PARAMS = DecodeParams(repetition_penalty=2.0, logit_bias={3: -100.0}, bad_words=[[1, 2]])


def _history(decode: object = None) -> dict[str, Any]:
    request: dict[str, Any] = {"kind": "new_prompt", "prompt": [1, 2, 3], "max_new_tokens": 4, "eos_token_id": None,
                               "drafter": None, "plan": None}  # fmt: skip
    if decode is not None:
        request["decode"] = decode
    return {"format": "specproof-session/1", "vocab_size": 64, "engine": None, "failing_request": None,
            "requests": [request, {"kind": "reset"}]}  # fmt: skip


def test_a_history_without_decode_parameters_reads_and_writes_as_before() -> None:
    doc = _history()
    history = SessionHistory.from_json(doc)
    assert history.requests[0].decode is None
    assert history.to_json() == doc  # no "decode" key added


def test_a_request_s_decode_parameters_round_trip(tmp_path: Path) -> None:
    history = SessionHistory.from_json(_history(PARAMS.to_json()))
    assert history.requests[0].decode == PARAMS
    path = history.save(tmp_path / "h.json")
    assert SessionHistory.load(path) == history
    assert "decode={" in history.describe()


@pytest.mark.parametrize(
    ("decode", "message"),
    [
        ({"temperature": 1.0}, r"requests\[0\]\.decode"),  # not a decode parameter: the schema names it
        ({"repetition_penalty": 0}, r"requests\[0\]\.decode"),
        ({"presence_penalty": 1000.0}, r"requests\[0\]\.decode is not valid decode parameters: .*presence_penalty"),
        ({"logit_bias": {"99": 1.0}}, r"requests\[0\]\.decode is not valid decode parameters: .*99"),
    ],
)
def test_bad_decode_parameters_in_a_history_are_named(decode: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SessionHistory.from_json(_history(decode))


def test_decode_features_need_a_model_and_known_names() -> None:
    def options(**kw: Any) -> dict[str, Any]:
        return {"engine_factory": object, "greedy": lambda *a: ([], None), "vocab_size": 8, **kw}

    with pytest.raises(StrategyArgumentError, match="needs decode_reference_factory"):
        SessionMachine.configure(**options(decode_features=("penalties",)))
    with pytest.raises(StrategyArgumentError, match="names 'grammar'"):
        SessionMachine.configure(**options(decode_features=("grammar",), decode_reference_factory=object))
    with pytest.raises(StrategyArgumentError, match="not a str"):
        SessionMachine.configure(**options(decode_features="penalties", decode_reference_factory=object))


def _result(spec: str, *, decode_state: bool) -> dict[str, Any]:
    report = certify("engine", engine=spec, only=("engine.session",), decode_state=decode_state).to_json()
    [result] = report["results"]
    return result  # type: ignore[no-any-return]


def test_without_the_option_the_session_draws_no_decode_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("decode parameters drawn without --decode-state")

    monkeypatch.setattr(_session_requests, "processor_configs", refuse)
    result = _result(MEMBER, decode_state=False)  # its bug needs processors: unseen without them
    assert result["status"] == "pass", result
    assert not any("decode processors" in note for note in result["notes"])


@pytest.mark.slow
def test_correct_session_engines_pass_with_decode_draws() -> None:
    result = _result(CORRECT, decode_state=True)
    assert result["status"] == "pass", result
    assert any(note.startswith("decode processors on ") for note in result["notes"]), result["notes"]
    # engines that keep no cache between calls are not session subjects (the rollback machine drives them)
    for spec in (f"{ZOO}:decode_zoo_engine", f"{ZOO}:decode_replay_engine"):
        assert _result(spec, decode_state=True)["status"] not in ("fail", "error")


@pytest.mark.slow
def test_a_penalty_buffer_carried_between_requests_is_rejected_and_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hyp, report = tmp_path / "hyp", tmp_path / "r.json"
    args = ["certify", "engine", "--engine", MEMBER, "--only", "engine.session", "--decode-state"]
    assert main([*args, "--hypothesis-dir", str(hyp), "--report", str(report)]) == 1
    [result] = json.loads(report.read_text())["results"]
    assert result["status"] == "fail" and "with decode parameters" in result["detail"], result
    argv = shlex.split(result["reproduce"])
    saved = SessionHistory.load(argv[argv.index("--replay-session") + 1])
    assert saved.failing_request is not None and saved.requests[saved.failing_request].decode is not None
    # pasted (a Hypothesis directory of its own), the saved history fails again; a correct engine passes it
    monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(tmp_path / "pasted"))
    assert main([*argv[1:], "--report", str(tmp_path / "again.json")]) == 1
    replay = argv[argv.index("--replay-session") + 1]
    assert main(["certify", "engine", "--engine", CORRECT, "--only", "engine.session", "--replay-session", replay]) == 0
