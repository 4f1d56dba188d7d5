"""Meta-tests: certify never says PASS without having checked something, and bad input is a clear exit 2.

Each scenario is one a user hit with an earlier version (issue 11); each gets the verdict or the
error it deserves, through the CLI as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main

ZOO = "specproof.conformance.zoo"


def _run(args: list[str], tmp_path: Path) -> tuple[int, dict[str, Any] | None]:
    out = tmp_path / "r.json"
    code = main(["certify", *args, "--report", str(out)])
    return code, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize(
    "args",
    [
        ["--only", "nosuch.invariant"],
        ["drafter", "--engine", f"{ZOO}:zoo_engine", "--only", "drafter.max"],
        ["--tie-tolerance", "-1"],
        ["--tie-tolerance", "nan"],
        ["--atol", "inf"],
        ["--report", "/proc/nope/r.json"],
        ["--markdown", "/nonexistent/dir/r.md"],
    ],
)
def test_usage_errors_exit_2_before_any_work(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # (argparse's own errors exit; the rest return 2)
        raise SystemExit(main(["certify", *args]))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error:" in err
    assert not Path("/nonexistent").exists()


def test_an_engine_that_always_raises_is_not_a_pass(tmp_path: Path) -> None:
    code, report = _run(["engine", "--engine", f"{ZOO}:raises_every_call", "--only", "engine.kv-length"], tmp_path)
    assert report is not None and report["verdict"] == "fail" and code == 1
    (row,) = report["results"]
    assert row["status"] == "fail" and "did not complete" in row["detail"] and "RaisesEveryCall" in row["detail"]


def test_a_drafter_returning_none_passes_no_engine_check(tmp_path: Path) -> None:
    code, report = _run(["drafter", "--drafter", "_bad_plugins:returns_none", "--only", "engine.kv-length"], tmp_path)
    assert report is not None and code == 1 and report["verdict"] == "fail"
    assert {r["status"] for r in report["results"]} == {"fail"}
    assert all("returned NoneType" in r["detail"] for r in report["results"])
    code, report = _run(["drafter", "--drafter", "_bad_plugins:returns_none", "--only", "engine.*"], tmp_path)
    assert code == 1 and report is not None
    statuses = {r["invariant"]: r["status"] for r in report["results"] if r["case"] == "replay"}
    assert statuses["engine.lossless"] == "fail"
    assert "pass" not in statuses.values()  # nothing passes on generations that never completed


def test_a_target_certificate_does_not_name_an_unchecked_drafter(tmp_path: Path) -> None:
    code, report = _run(
        ["target", "--target", f"{ZOO}:zoo_target", "--drafter", f"{ZOO}:lookup_drafter", "--only", "target.shape"],
        tmp_path,
    )
    assert code == 0 and report is not None
    assert "drafter" not in report["subjects"]
    assert any("not certified" in u for u in report["subjects"]["used"])


def test_only_takes_a_comma_list(tmp_path: Path) -> None:
    code, report = _run(["--only", "engine.kv-length,engine.lossless"], tmp_path)
    assert code == 0 and report is not None
    assert {r["invariant"] for r in report["results"]} == {"engine.kv-length", "engine.lossless"}


def test_ctrl_c_exits_130_and_writes_the_partial_report(tmp_path: Path) -> None:
    code, report = _run(["drafter", "--drafter", "_bad_plugins:interrupts", "--only", "drafter.*"], tmp_path)
    assert code == 130 and report is not None
    assert report["verdict"] == "interrupted"


def test_no_line_of_a_failure_is_wrapped_in_a_log(tmp_path: Path) -> None:
    """In a CI log (not a terminal) the reproduce command is one line that pastes back into a shell."""
    env = {**os.environ, "COLUMNS": "80", "SPECPROOF_HYPOTHESIS_DIR": str(tmp_path / "hyp")}
    spec = f"{ZOO}:processed_off_by_one"
    proc = subprocess.run(
        [sys.executable, "-m", "specproof.cli", "certify", "engine", "--engine", spec, "--only", "engine.kv-length"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "reproduce:" in ln]
    assert lines and lines[0].strip() == (
        f"reproduce: specproof certify engine --engine {spec} --profile quick --only engine.kv-length"
    )
    assert any(ln.startswith("fail ") for ln in proc.stdout.splitlines())  # a line per check as it finished
    assert not (tmp_path / ".hypothesis").exists() and not (tmp_path / ".benchmarks").exists()


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    proc = subprocess.run(
        f"{sys.executable} -m specproof.cli generate --ids 1,2,3 --max-new-tokens 8 --json | head -c 5",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_a_run_where_everything_skips_is_inconclusive(tmp_path: Path) -> None:
    """A black-box engine asked only about a per-round invariant: nothing can be checked, so not PASS."""
    code, report = _run(["engine", "--engine", f"{ZOO}:greedy_only_engine", "--only", "engine.kv-length"], tmp_path)
    assert code == 3 and report is not None and report["verdict"] == "inconclusive"
    (row,) = report["results"]
    assert row["status"] == "skip" and "black-box" in row["detail"]


def test_report_files_get_the_usual_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        code, _ = _run(["--only", "drafter.max-length"], tmp_path)
    finally:
        os.umask(old)
    assert code == 0
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def test_generate_runs_an_engine_plugin_and_prints_its_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--engine", f"{ZOO}:zoo_engine", "--ids", "1,2,3", "--max-new-tokens", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and len(out["tokens"]) == 8 and out["rounds"] and "accepted" in out["rounds"][0]


def test_bench_and_generate_check_output_paths_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--ids", "1,2", "--trace", "/nonexistent/t.jsonl"]) == 2
    assert main(["bench", "--quick", "--json", "/nonexistent/b.json"]) == 2
    assert "does not exist" in capsys.readouterr().err
