"""``specproof fuzz`` accounts for every worker: a worker that dies is reported with its exit status or
signal and the campaign is never PASS; SIGTERM stops a campaign like Ctrl-C (partial report, workers
stopped, exit 143); ``--workers`` is bounded by what the machine holds.

The subject is the default drafter with one fast check (``drafter.max-length``): a correct subject,
so a PASS here could only come from the campaign's own accounting.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main
from specproof.formats import validate

pytestmark = pytest.mark.slow  # real campaigns of seconds: outside `tox -e quick`, always in `tox`

CORRECT = ("drafter", "--only", "drafter.max-length")


class _Campaign(subprocess.Popen[str]):
    """A ``specproof fuzz`` process whose output a thread reads as it comes (``lines``), so a test can
    wait for what the campaign says (a worker's first round) instead of sleeping."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.stdout or ()), daemon=True)
        self._reader.start()

    def output(self, timeout: float) -> str:
        """Wait for the campaign's end (``timeout`` s at most) and return all it printed."""
        self.wait(timeout=timeout)
        self._reader.join(timeout=30)
        return "".join(self.lines)


def _fuzz(*args: str, tmp_path: Path) -> _Campaign:
    env = {**os.environ, "SPECPROOF_HYPOTHESIS_DIR": str(tmp_path / "hyp"), "OMP_NUM_THREADS": "1"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return _Campaign(
        [sys.executable, "-m", "specproof", "fuzz", *CORRECT, *args, "--report", str(tmp_path / "r.json")], env
    )


def _workers(pid: int) -> list[int]:
    """The campaign's worker processes: its children started by multiprocessing's spawn (not its
    resource tracker)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
                found.append(int(child))
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _reap(proc: _Campaign, workers: list[int]) -> None:
    """After a test, pass or fail: nothing it started keeps running (a campaign that mishandles the
    signal leaves its workers behind, holding the output pipe)."""
    for pid in [proc.pid, *workers]:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _running_rounds(proc: _Campaign, n: int) -> list[int]:
    """Wait until each of the campaign's n workers has finished a round (the log's line for a worker's
    first round; a fixed sleep would race a slow start on a loaded machine): checks have passed, so an
    accounting that forgot a worker would say PASS."""
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, proc.output(timeout=60)
        said = "".join(proc.lines)
        if all(f"] worker {i}: round 1 " in said for i in range(n)):
            workers = _workers(proc.pid)
            if len(workers) == n:
                return workers
        time.sleep(0.2)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the workers through /proc (Linux)")
@pytest.mark.parametrize("killed", [1, 2], ids=["one-of-two", "both"])
def test_a_killed_worker_is_reported_and_the_campaign_is_never_pass(tmp_path: Path, killed: int) -> None:
    proc = _fuzz("--workers", "2", tmp_path=tmp_path)  # no --for: the death stops it
    workers = _running_rounds(proc, 2)
    try:
        for pid in workers[:killed]:
            os.kill(pid, signal.SIGKILL)
        out = proc.output(timeout=120)
        survivors = [pid for pid in workers if _alive(pid)]
    finally:
        _reap(proc, workers)
    assert proc.returncode == 3, out[-3000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["verdict"] == "inconclusive", data["verdict_reason"]
    assert validate("report-2", data) == []
    assert data["campaign"]["workers_lost"], data["campaign"]
    lost = data["campaign"]["workers_lost"]
    sigkilled = [w for w in lost if w["exitcode"] == -signal.SIGKILL and "killed by SIGKILL" in w["why"]]
    assert len(sigkilled) == killed, lost
    # the survivor finishes its check and reports normally: each worker has a pipe of its own, so
    # a worker killed mid-report cannot block another (no shared lock), nor is it ever terminated
    assert len(lost) == killed, lost
    assert "did not finish" in data["verdict_reason"] and "SIGKILL" in data["verdict_reason"]
    stopped = data["campaign"]["stopped"]  # the death stops the campaign
    assert stopped.startswith("worker ") and "killed by SIGKILL" in stopped, stopped
    assert "verdict: PASS" not in out and "lost: killed by SIGKILL" in out, out[-3000:]
    assert not survivors, f"workers {survivors} outlived their campaign"


# write(2)'s number, by machine: a thread blocked in it is a worker (or its queue's feeder thread)
# waiting for room in a full pipe to the parent
_WRITE = {"x86_64": "1", "aarch64": "64"}.get(platform.machine())


def _writing(pid: int) -> bool:
    """Whether a thread of process ``pid`` is blocked in write(2) (/proc/PID/task/TID/syscall)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            if (task / "syscall").read_text().split()[0] == _WRITE:
                return True
        except (OSError, IndexError):
            continue
    return False


@pytest.mark.skipif(
    _WRITE is None or not Path("/proc/self/task").is_dir(),
    reason="reads /proc/PID/task/TID/syscall (Linux, x86_64 or aarch64)",
)
def test_a_worker_killed_mid_report_blocks_no_other(tmp_path: Path) -> None:
    """The parent is stopped until the workers' reports fill the pipe and a worker is blocked writing
    one; that worker is killed mid-write, the parent continued. With one queue shared by the workers,
    the killed worker held its write lock (the survivor then blocks on its next report and is
    terminated) and left half a message in it (the parent then waits for the rest for ever). With a
    pipe per worker, the half message is the end of the killed worker's pipe, and the survivor
    stops when asked and reports normally."""
    proc = _fuzz("--workers", "2", tmp_path=tmp_path)  # no --for: the killed worker's end stops it
    workers = _running_rounds(proc, 2)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 90
            blocked = [pid for pid in workers if _writing(pid)]
            while not blocked and time.monotonic() < deadline:
                time.sleep(0.2)
                blocked = [pid for pid in workers if _writing(pid)]
            assert blocked, "no worker blocked on its report within 90 s of the parent stopping"
            killed = blocked[0]
            os.kill(killed, signal.SIGKILL)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        out = proc.output(timeout=120)  # (the shared queue: the parent never returns)
        survivors = [pid for pid in workers if _alive(pid)]
    finally:
        _reap(proc, workers)
    assert proc.returncode == 3, out[-3000:]
    data = json.loads((tmp_path / "r.json").read_text())
    lost = data["campaign"]["workers_lost"]
    assert len(lost) == 1, lost  # the killed worker only: the survivor was never terminated
    assert lost[0]["exitcode"] == -signal.SIGKILL and "killed by SIGKILL" in lost[0]["why"], lost
    assert data["verdict"] == "inconclusive" and validate("report-2", data) == []
    assert "terminated" not in out and "verdict: PASS" not in out, out[-3000:]
    assert not survivors, f"workers {survivors} outlived their campaign"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the workers through /proc (Linux)")
def test_sigterm_stops_the_campaign_like_ctrl_c(tmp_path: Path) -> None:
    proc = _fuzz("--workers", "2", tmp_path=tmp_path)  # no --for: only the signal ends it
    workers = _running_rounds(proc, 2)
    try:
        proc.send_signal(signal.SIGTERM)  # to the parent alone, as `kill PID` and CI timeouts do
        out = proc.output(timeout=120)
        survivors = [pid for pid in workers if _alive(pid)]
    finally:
        _reap(proc, workers)
    assert proc.returncode == 143, out[-3000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["verdict"] == "interrupted" and data["campaign"]["stopped"] == "interrupted (SIGTERM)"
    assert validate("report-2", data) == []
    assert data["campaign"]["rounds"] > 0 and data["results"], data["campaign"]
    assert "verdict: INTERRUPTED" in out and "Traceback" not in out, out[-3000:]
    assert not survivors, f"workers {survivors} outlived their campaign"


def test_more_workers_than_the_machine_holds_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specproof.conformance._campaign import max_workers

    most, why = max_workers()
    assert most >= 1 and why
    report = tmp_path / "r.json"
    # (an unknown --only as well: today's code, which has no bound, stops at it instead of spawning)
    args = ["fuzz", "drafter", "--only", "drafter.nope", "--rounds", "1", "--report", str(report)]
    code = main([*args, "--workers", str(most + 1), "--hypothesis-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"--workers {most + 1}: this machine holds at most {most}" in err, err
    assert "drafter.nope" not in err  # checked first, before the plan
    assert not report.exists()


def test_the_bound_counts_cpus_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import specproof.conformance._campaign as campaign

    monkeypatch.setattr(campaign.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(campaign, "_available_memory", lambda: 64 * 2**30)
    assert campaign.max_workers()[0] == 2 * campaign.WORKERS_PER_CPU
    monkeypatch.setattr(campaign, "_available_memory", lambda: 3 * campaign.WORKER_MEMORY + 1)
    most, why = campaign.max_workers()
    assert most == 3 and "memory" in why
    monkeypatch.setattr(campaign, "_available_memory", lambda: 0)
    assert campaign.max_workers()[0] == 1  # one worker always: the machine ran the parent


def test_a_worker_that_raised_makes_the_campaign_inconclusive() -> None:
    from specproof.conformance._campaign import CampaignOptions, CampaignState, WorkerState

    options = CampaignOptions(plan={"subject": "drafter"}, db=None, hypothesis_dir="/nonexistent", workers=2)
    state = CampaignState(options=options, workers=[WorkerState(index=0), WorkerState(index=1)])
    result: dict[str, Any] = {
        "id": "drafter.max-length",
        "status": "pass",
        "examples": 3,
        "exercised": 3,
        "seconds": 0.1,
    }
    state.absorb_check(0, result)
    state.absorb_round(0, {})
    state.workers[0].done = True
    assert state.report()["verdict"] == "pass"  # the control: every worker accounted for
    state.workers[1].lost, state.workers[1].exitcode = "killed by SIGKILL after 0 round(s)", -9
    report = state.report()
    assert report["verdict"] == "inconclusive" and "worker 1 killed by SIGKILL" in report["verdict_reason"]
    assert report["campaign"]["workers_lost"] == [
        {"worker": 1, "exitcode": -9, "rounds": 0, "why": "killed by SIGKILL after 0 round(s)"}
    ]
