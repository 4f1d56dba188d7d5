"""A session history is bounded in size and budget before it is read or replayed (issue 35, faults):
a well-formed history with a 5M-token prompt, a million requests, a million-round plan or
``max_new_tokens`` 10^18 is refused at once naming the field and the stated limit; one that does not
fit the engine (its context, its vocabulary) is a usage error (exit 2) before any check runs, not a
check error (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main
from specproof.strategies import SessionFileError, SessionHistory

ENGINE = "specproof.conformance.zoo:session_engine"  # vocab_size 64, max_context 256
LIMITS = "docs/contract.md, sessions"


def _request(prompt: list[int], budget: int, **extra: Any) -> dict[str, Any]:
    request = {"kind": "new_prompt", "prompt": prompt, "max_new_tokens": budget, "eos_token_id": None}
    return {**request, "drafter": None, "plan": None, **extra}


def _history(*requests: dict[str, Any]) -> dict[str, Any]:
    head = {"format": "specproof-session/1", "vocab_size": 64, "engine": None, "failing_request": None}
    return {**head, "requests": list(requests)}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            _history(_request([1] * 5_000_000, 4)),
            f"h: requests[0].prompt has 5000000 tokens, more than a session history may hold (131072; {LIMITS})",
        ),
        (
            _history(*[{"kind": "reset"}] * 1_000_000),
            f"h: requests has 1000000 requests, more than a session history may hold (10000; {LIMITS})",
        ),
        (
            _history(*[_request([1] * 100_000, 4)] * 5),
            "h: requests[:3] (their prompts) has 300000 tokens, more than a session history may hold "
            f"(262144; {LIMITS})",
        ),
        (
            _history(_request([1, 2], 4, drafter="scripted", plan=[[1, 1]] * 1_000_000)),
            f"h: requests[0].plan has 1000000 rounds, more than a session history may hold (4096; {LIMITS})",
        ),
        (
            _history(_request([1, 2], 10**18)),
            f"h: requests[0].max_new_tokens = 1000000000000000000 is more than a request may ask (1048576; {LIMITS})",
        ),
    ],
    ids=["5M-token prompt", "a million requests", "5M tokens in all", "a million-round plan", "budget 10^18"],
)
def test_a_history_past_the_stated_limits_is_refused_before_it_is_read(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(SessionFileError) as err:
        SessionHistory.from_json(doc, source="h")
    assert str(err.value) == message


@pytest.mark.slow  # the schema reads the 131072 ids (seconds)
def test_a_history_at_the_limits_is_read() -> None:
    history = SessionHistory.from_json(_history(_request([1] * 131_072, 1_048_576)), source="h")
    assert len(history.requests[0].prompt) == 131_072 and history.requests[0].max_new_tokens == 1_048_576


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        (
            [_request([1, 2, 3], 300)],
            "requests[0] does not fit engine session_engine: its prompt of 3 tokens and max_new_tokens=300 need a "
            "context of 303 tokens, and the engine's max_context is 256",
        ),
        (
            [{"kind": "reset"}, _request([1] * 250, 7)],
            "requests[1] does not fit engine session_engine: its prompt of 250 tokens and max_new_tokens=7 need a "
            "context of 257 tokens, and the engine's max_context is 256",
        ),
    ],
)
def test_a_history_that_does_not_fit_the_engine_is_a_usage_error(
    requests: list[dict[str, Any]], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "history.json"
    path.write_text(json.dumps(_history(*requests)))
    report = tmp_path / "r.json"
    args = ["certify", "engine", "--engine", ENGINE, "--only", "engine.session", "--replay-session", str(path)]
    code = main([*args, "--db", "none", "--hypothesis-dir", str(tmp_path / "hyp"), "--report", str(report)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip() == f"specproof certify: error: {path}: {message}"
    assert not report.exists() and not (tmp_path / "hyp").exists()


def test_an_id_past_the_engine_vocabulary_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.json"
    doc = _history(_request([1, 100], 4))
    doc["vocab_size"] = 256
    path.write_text(json.dumps(doc))
    args = ["certify", "engine", "--engine", ENGINE, "--only", "engine.session", "--replay-session", str(path)]
    assert main([*args, "--db", "none", "--hypothesis-dir", str(tmp_path / "hyp")]) == 2
    err = capsys.readouterr().err.strip()
    message = "requests[0] has token id 100, but engine session_engine has vocab_size=64"
    assert err == f"specproof certify: error: {path}: {message}"


def test_a_history_that_fits_is_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.json"
    path.write_text(json.dumps(_history(_request([1] * 240, 16), {"kind": "reset"}, _request([5, 6, 7], 8))))
    args = ["certify", "engine", "--engine", ENGINE, "--only", "engine.session", "--replay-session", str(path)]
    assert main([*args, "--db", "none", "--hypothesis-dir", str(tmp_path / "hyp")]) == 0, capsys.readouterr().out
