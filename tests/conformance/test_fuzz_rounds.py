"""``specproof fuzz --rounds N``: a campaign measured in rounds, not seconds, so a test (or a CI job)
reaches the same examples at any load; a campaign that finished no round, or fewer than it was asked
for, is never PASS (issue 35: a plug-in campaign given two seconds of ``--for`` ran 0 rounds at load 8-16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specproof.conformance._campaign import CampaignOptions, CampaignState, WorkerState

PASSED: dict[str, Any] = {"id": "drafter.max-length", "status": "pass", "examples": 3, "exercised": 3, "seconds": 0.1}


def _state(*, workers: int = 1, rounds: int | None = None, stopped: str = "") -> CampaignState:
    options = CampaignOptions(
        plan={"subject": "drafter"}, db=None, hypothesis_dir="/nonexistent", workers=workers, rounds=rounds
    )
    state = CampaignState(options=options)
    state.workers = [WorkerState(index=i) for i in range(workers)]
    state.stopped = stopped
    return state


def test_a_campaign_that_finished_no_round_is_never_pass() -> None:
    state = _state(stopped="--for 2 s elapsed")
    state.absorb_check(0, PASSED)  # a check passed, in a round the stop then cut short
    state.absorb_round(0, {}, complete=False)
    report = state.report()
    assert report["campaign"]["rounds"] == 0
    assert report["verdict"] == "inconclusive"
    assert report["verdict_reason"] == "the campaign finished no round (--for 2 s elapsed)"
    state.absorb_round(0, {})  # the control: one whole round with a passing check
    assert state.report()["verdict"] == "pass" and state.report()["campaign"]["rounds"] == 1


def test_fewer_rounds_than_asked_is_inconclusive_and_all_of_them_can_pass() -> None:
    state = _state(workers=2, rounds=3, stopped="--for 600 s elapsed")
    state.absorb_check(0, PASSED)
    for worker, finished in ((0, 3), (1, 2)):
        for _ in range(finished):
            state.absorb_round(worker, {})
    report = state.report()
    assert report["verdict"] == "inconclusive"
    assert report["verdict_reason"] == (
        "5 of the 6 round(s) asked for ran (--rounds 3 on 2 worker(s)): --for 600 s elapsed"
    )
    state.absorb_round(1, {})  # the control: every worker ran its 3 rounds
    assert state.report()["verdict"] == "pass", state.report()["verdict_reason"]


def test_a_failure_found_before_the_rounds_ran_out_stays_a_failure() -> None:
    state = _state(rounds=5, stopped="1 failing check(s) found (--max-failures)")
    state.absorb_check(0, {**PASSED, "status": "fail", "detail": "too long", "violations": [], "reproduce": "x"})
    assert state.report()["verdict"] == "fail"


@pytest.mark.slow  # two real rounds in a subprocess: seconds
def test_rounds_stop_the_campaign_after_that_many_seeded_rounds(tmp_path: Path) -> None:
    env = {**os.environ, "SPECPROOF_HYPOTHESIS_DIR": str(tmp_path / "hyp"), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    report = tmp_path / "r.json"
    args = ["fuzz", "drafter", "--only", "drafter.max-length", "--rounds", "2", "--seed", "5", "--report", str(report)]
    done = subprocess.run(
        [sys.executable, "-m", "specproof", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    campaign = json.loads(report.read_text())["campaign"]
    assert campaign["rounds"] == 2 and campaign["stopped"] == "every worker ran its 2 round(s)", campaign
    assert "1 worker(s), profile quick, database" in done.stdout and "2 round(s) per worker" in done.stdout
    assert "] worker 0: round 1 (seed 5)" in done.stdout, done.stdout  # the log's line at the first round
    assert "verdict: PASS" in done.stdout
