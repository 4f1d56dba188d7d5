"""A session failure's reproduce line reproduces it: ``--replay-session FILE`` only for a history seen
to fail on a newly built engine (what the pasted line replays on), else the seed-based command.

- The zoo's ``features_stale_across_requests`` keeps its feature cache across ``reset()``: its failing
  history fails only on an engine that served earlier requests. The failure says that state survived
  reset(), names no session file, and its reproduce line, pasted, fails again.
- ``prefix_hit_zero_features`` fails within one session: its history fails on a new engine too, so its
  reproduce line replays the saved file, and pasted, fails again.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main

pytestmark = pytest.mark.slow  # real certify runs: outside `tox -e quick`, always in `tox`

ZOO = "specproof.conformance.zoo"


def _session_result(spec: str, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    hyp, report = tmp_path / "hyp", tmp_path / "r.json"
    args = ["certify", "engine", "--engine", spec, "--only", "engine.session", "--hypothesis-dir", str(hyp)]
    assert main([*args, "--report", str(report)]) == 1
    [result] = [r for r in json.loads(report.read_text())["results"] if r["invariant"] == "engine.session"]
    assert result["status"] == "fail", result
    return result, hyp


def _paste(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run the printed line (a Hypothesis directory of its own: nothing carried over) and its result."""
    pasted = tmp_path / "pasted"
    pasted.mkdir()
    monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(pasted))
    report = tmp_path / "pasted.json"
    argv = shlex.split(line)
    assert argv[:2] == ["specproof", "certify"], line
    assert main([*argv[1:], "--report", str(report)]) == 1, f"pasted, the reproduce line passed: {line}"
    [result] = [r for r in json.loads(report.read_text())["results"] if r["invariant"] == "engine.session"]
    return result  # type: ignore[no-any-return]


def test_state_that_survives_reset_is_named_and_its_reproduce_line_fails_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, hyp = _session_result(f"{ZOO}:features_stale_across_requests", tmp_path)
    assert result["detail"].startswith("[engine.session]: state survived reset(): "), result["detail"]
    assert "fails only on an engine that served earlier requests before reset()" in result["detail"]
    assert "--replay-session" not in result["reproduce"], result["reproduce"]
    # no file that would pass when replayed (the directory itself is made and probed before the run)
    assert not list((hyp / "sessions").glob("*")), list((hyp / "sessions").glob("*"))
    again = _paste(result["reproduce"], tmp_path, monkeypatch)
    assert again["status"] == "fail" and again["detail"].startswith("[engine.session]: state survived reset(): "), again


def test_a_history_that_fails_on_a_new_engine_keeps_its_replay_session_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, hyp = _session_result(f"{ZOO}:prefix_hit_zero_features", tmp_path)
    assert "state survived reset()" not in result["detail"], result["detail"]
    argv = shlex.split(result["reproduce"])
    history = Path(argv[argv.index("--replay-session") + 1])
    assert history.is_relative_to(hyp / "sessions") and history.is_file(), history
    again = _paste(result["reproduce"], tmp_path, monkeypatch)
    assert again["status"] == "fail" and "all zeros" in again["detail"], again
