"""``specproof fuzz``: campaigns on many workers that save what they find, and replay across machines.

The zoo's ``length_cap_hides_eos_in_block`` is found by seeded quick searches (seeds 1 and 2);
a campaign with ``--seed 1`` runs exactly those seeds first, so these tests take seconds and do
not depend on what derandomized ``quick`` finds by itself: they check that the later run
*replayed* the saved failure (the report's ``database.replayed``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import build_parser, main

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

MEMBER = "specproof.conformance.zoo:length_cap_hides_eos_in_block"
CHECK = "length_cap_hides_eos_in_block-engine.stop"


def _specproof(*args: str, hyp: Path, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "SPECPROOF_HYPOTHESIS_DIR": str(hyp), "OMP_NUM_THREADS": "1"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "specproof", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_help_says_what_every_option_does(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    fuzz = sub.choices["fuzz"]
    options = [a for a in fuzz._actions if a.option_strings and a.dest != "help"]
    assert {"--for", "--rounds", "--max-failures", "--workers", "--db", "--only", "--seed", "--report"} <= {
        s for a in options for s in a.option_strings
    }
    for action in options:
        assert action.help and len(action.help) > 10, action.option_strings
    with pytest.raises(SystemExit):
        main(["fuzz", "--help"])
    assert "--max-failures" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "--workers"),
        (["--for", "soon"], "--for"),
        (["--for", "0"], "--for"),
        (["--max-failures", "0"], "--max-failures 0: at least 1"),
        (["--rounds", "0"], "--rounds 0: at least 1"),
        (["--rounds", "-3"], "--rounds -3: at least 1"),
        (["--only", "engine.nope"], "engine.nope"),
        (["--db", "redis://127.0.0.1:1/0"], "does not answer"),
        (["--tie-tolerance", "-1"], "tie-tolerance"),
    ],
)
def test_bad_options_are_usage_errors_before_any_work(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    code = main(["fuzz", "engine", "--engine", MEMBER, "--rounds", "1", *args, "--report", str(report)])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not report.exists()


def test_a_campaign_finds_saves_and_the_next_gate_replays(tmp_path: Path) -> None:
    hyp = tmp_path / "hyp"
    report = tmp_path / "campaign.json"
    code, out = _finish(
        _specproof(
            "fuzz",
            "engine",
            "--engine",
            MEMBER,
            "--only",
            "engine.stop",
            "--workers",
            "2",
            "--seed",
            "1",
            "--max-failures",
            "1",
            "--rounds",
            "1",  # seeds 1 and 2 (one round per worker) find it: a count, the same at any load
            "--report",
            str(report),
            hyp=hyp,
        )
    )
    assert code == 1, out
    data = json.loads(report.read_text())
    campaign = data["campaign"]
    assert campaign["workers"] == 2 and campaign["examples"] > 0 and campaign["time_to_first_failure"] is not None
    assert campaign["failures"][0]["check"] == CHECK and "--seed" in campaign["failures"][0]["reproduce"]
    assert "max-failures" in campaign["stopped"]
    assert data["verdict"] == "fail" and data["path_coverage"]
    # the reproduce line works without the database (a seeded run)
    reproduce = campaign["failures"][0]["reproduce"].split()[1:]
    code, out = _finish(_specproof(*reproduce, "--db", "none", hyp=tmp_path / "elsewhere"))
    assert code == 1, out
    # the next derandomized gate on this machine replays it from the default database
    gate = tmp_path / "gate.json"
    code, out = _finish(
        _specproof("certify", "engine", "--engine", MEMBER, "--only", "engine.stop", "--report", str(gate), hyp=hyp)
    )
    assert code == 1, out
    gated = json.loads(gate.read_text())
    assert gated["derandomized"] and gated["database"]["replayed"] == {CHECK: 1}


def test_a_campaign_keeps_the_rare_paths_it_reached_for_the_next_gate(
    tmp_path: Path, seed_reaching_max_context: int
) -> None:
    """The first round (its seed searched for by the fixture: which seeds do depends on the Hypothesis
    version) reaches max_context on the built-in stack; derandomized quick does not by itself."""
    hyp = tmp_path / "hyp"
    report, gate = tmp_path / "campaign.json", tmp_path / "gate.json"
    only = ["engine", "--only", "engine.stop"]
    seed = str(seed_reaching_max_context)
    code, out = _finish(_specproof("fuzz", *only, "--seed", seed, "--rounds", "1", "--report", str(report), hyp=hyp))
    assert code == 0, out
    campaign = json.loads(report.read_text())
    assert campaign["campaign"]["rounds"] == 1 and "ran its 1 round(s)" in campaign["campaign"]["stopped"]
    assert all(row["clamped_at_max_context"] for row in campaign["path_coverage"].values())
    assert campaign["database"]["covering_saved"].keys() == {"checkpoint", "replay"}
    code, out = _finish(_specproof("certify", *only, "--report", str(gate), hyp=hyp))
    assert code == 0, out
    gated = json.loads(gate.read_text())
    assert gated["derandomized"] and all(row["clamped_at_max_context"] for row in gated["path_coverage"].values())
    assert gated["database"]["covering_replayed"] == {"checkpoint": 1, "replay": 1}
    assert "replayed 2 covering example(s)" in out and "clamped_at_max_context" in out


def test_two_machines_share_one_redis_and_a_third_replays(tmp_path: Path, redis_server: Any) -> None:
    """Two campaign processes (separate local directories: two machines) against one real redis-server,
    then a derandomized quick certify in a third process that never generated the failure."""
    url = redis_server.url
    campaigns = [
        _specproof(
            "fuzz",
            "engine",
            "--engine",
            MEMBER,
            "--only",
            "engine.stop",
            "--seed",
            str(seed),
            "--max-failures",
            "1",
            "--rounds",
            "1",
            "--db",
            url,
            "--report",
            str(tmp_path / f"c{seed}.json"),
            hyp=tmp_path / f"m{seed}",
        )
        for seed in (1, 2)
    ]
    for proc in campaigns:
        code, out = _finish(proc)
        assert code == 1, out
    gate = tmp_path / "gate.json"
    code, out = _finish(
        _specproof(
            "certify",
            "engine",
            "--engine",
            MEMBER,
            "--only",
            "engine.stop,engine.lossless",
            "--profile",
            "quick",
            "--db",
            url,
            "--report",
            str(gate),
            hyp=tmp_path / "third",
        )
    )
    assert code == 1, out
    data = json.loads(gate.read_text())
    assert data["derandomized"] and data["database"]["replayed"].get(CHECK) == 1, data["database"]
    stop = next(r for r in data["results"] if r["invariant"] == "engine.stop")
    assert stop["status"] == "fail" and all(v["invariant"] == "engine.stop" for v in stop["violations"])
    assert f"--db {url}" in stop["reproduce"]


def test_a_redis_that_goes_away_stops_the_campaign_with_finds_kept_locally(tmp_path: Path, redis_server: Any) -> None:
    hyp = tmp_path / "hyp"
    report = tmp_path / "c.json"
    proc = _specproof(
        "fuzz",
        "engine",
        "--engine",
        MEMBER,
        "--only",
        "engine.stop",
        "--seed",
        "1",
        "--for",
        "600",  # a cap only: the test stops the server once a find is saved, and nothing asserted is timed
        "--db",
        redis_server.url,
        "--report",
        str(report),
        hyp=hyp,
    )
    local = hyp / "examples"
    deadline = time.monotonic() + 180
    while not (local.exists() and any(p.is_file() for p in local.rglob("*"))):  # the first find, saved locally
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    redis_server.stop()
    code, out = _finish(proc, timeout=120)
    assert code == 1, out  # a clean stop with the failure found so far, not a crash
    data = json.loads(report.read_text())
    assert data["campaign"]["lost"] and "stopped answering" in data["campaign"]["lost"]
    assert "database went away" in data["campaign"]["stopped"]
    assert data["campaign"]["failures"] and "Traceback" not in out
    # the failure is in the local directory: a certify against it replays it
    code, out = _finish(_specproof("certify", "engine", "--engine", MEMBER, "--only", "engine.stop", hyp=hyp))
    assert code == 1 and "replayed" in out, out


def test_ctrl_c_stops_the_campaign_with_its_report(tmp_path: Path) -> None:
    import signal

    report = tmp_path / "c.json"
    proc = _specproof(
        "fuzz",
        "engine",
        "--engine",
        "specproof.conformance.zoo:zoo_engine",
        "--only",
        "engine.stop",
        "--workers",
        "2",
        "--report",
        str(report),
        hyp=tmp_path / "hyp",
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # the workers are running rounds once the first failure is saved (a fixed sleep raced a slow start)
    examples, deadline = tmp_path / "hyp" / "examples", time.monotonic() + 180
    while not (examples.is_dir() and any(p.is_file() for p in examples.rglob("*"))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=60)[0]
        time.sleep(0.2)
    time.sleep(2)
    assert proc.poll() is None, proc.communicate()[0]
    os.killpg(proc.pid, signal.SIGINT)
    code, out = _finish(proc, timeout=60)
    assert code == 130, out
    data = json.loads(report.read_text())
    assert data["campaign"]["stopped"] == "interrupted (Ctrl-C)"
    assert data["verdict"] == "interrupted" and "verdict: INTERRUPTED" in out, out[-2000:]
    assert "Traceback" not in out


def test_the_campaign_merges_every_workers_database_account() -> None:
    from specproof.conformance._campaign import CampaignState

    state = CampaignState(options=None)  # type: ignore[arg-type]  # database() reads only the accounts
    state.databases = {
        0: {"replayed": {"a": 1}, "covering_saved": {"checkpoint": 2}, "covering_paths": {"replay": ["x"]}},
        1: {"replayed": {"a": 2}, "covering_saved": {"replay": 1}, "covering_paths": {"replay": ["y"]}, "warnings": []},
    }
    merged = state.database()
    assert merged is not None
    assert merged["replayed"] == {"a": 3} and merged["covering_saved"] == {"checkpoint": 2, "replay": 1}
    assert merged["covering_paths"] == {"replay": ["x", "y"]} and merged["warnings"] == []
