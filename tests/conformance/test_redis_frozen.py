"""A frozen Redis server (a real ``redis-server``, stopped with SIGSTOP: it accepts connections and
never answers) is noticed within seconds: at start-up a usage error (exit 2) naming the server,
mid-campaign a lost database the campaign reports at once and stops on, never PASS.

redis-py's defaults retry a timed-out call 10 times with backoff: 115 s to notice at start-up,
and mid-campaign only when a worker happened to call it (docs/fuzzing.md, "Many machines, one Redis").
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # real processes and a real redis-server: outside `tox -e quick`

SRC = Path(__file__).resolve().parents[2] / "src"
CORRECT = ("drafter", "--only", "drafter.max-length")  # a correct subject: a PASS could only be the database's
NOTICED = 15.0  # seconds (docs/fuzzing.md): the client's 5 s timeout, the parent's 2 s PING, and slack for load


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "SPECPROOF_HYPOTHESIS_DIR": str(tmp_path / "hyp"), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _timed(args: list[str], tmp_path: Path) -> tuple[float, int, str]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "specproof", *args],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return time.monotonic() - start, done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("command", ["certify", "fuzz"])
def test_a_frozen_redis_at_start_up_is_a_usage_error_within_seconds(
    tmp_path: Path, redis_server: Any, command: str
) -> None:
    refused = "redis://127.0.0.1:1/0"  # nothing listens: refused at once; the same start-up otherwise
    base, code, out = _timed([command, *CORRECT, "--db", refused], tmp_path)
    assert code == 2 and "does not answer" in out, out[-2000:]
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        seconds, code, out = _timed([command, *CORRECT, "--db", redis_server.url], tmp_path)
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    assert code == 2, out[-2000:]
    # the wait on the server alone: the start-up both runs share (imports, a loaded machine) taken off
    assert seconds - base < NOTICED, f"exit 2 after {seconds:.1f} s ({base:.1f} s against a refused port)"
    assert f"--db {redis_server.url!r}: the Redis server does not answer" in out and "Traceback" not in out, out
    assert "no answer within 5 s" in out, out


def test_a_redis_frozen_mid_campaign_is_reported_within_seconds_and_never_pass(
    tmp_path: Path, redis_server: Any
) -> None:
    import redis

    report = tmp_path / "r.json"
    # --for 600 is a cap only: the frozen server ends the campaign, and nothing asserted depends on what it reached
    args = ["fuzz", *CORRECT, "--workers", "2", "--for", "600", "--db", redis_server.url, "--report", str(report)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "specproof", *args],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[tuple[float, str]] = queue.Queue()

    def read() -> None:
        for line in proc.stdout or ():
            lines.put((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        # the workers are running rounds against the server (a fixed sleep would race a slow start)
        deadline = time.monotonic() + 180
        while int(client.info("stats")["total_commands_processed"]) < 50:
            assert proc.poll() is None and time.monotonic() < deadline, "the campaign made no Redis calls"
            time.sleep(0.2)
        frozen = time.monotonic()
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        proc.wait(timeout=300)  # (redis-py's defaults: about 2 minutes)
        ended = time.monotonic() - frozen
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    reader.join(timeout=30)
    said: list[tuple[float, str]] = []
    while not lines.empty():
        said.append(lines.get())
    out = "".join(line for _, line in said)
    noticed = [t - frozen for t, line in said if f"{redis_server.url} stopped answering" in line]
    assert noticed and noticed[0] < NOTICED, (
        f"reported after {noticed} s; the campaign ended after {ended:.1f} s\n{out}"
    )
    assert proc.returncode == 3, out[-3000:]
    data = json.loads(report.read_text())
    assert data["verdict"] == "inconclusive" and "verdict: PASS" not in out, out[-3000:]
    assert redis_server.url in data["campaign"]["lost"] and "stopped answering" in data["campaign"]["lost"]
    assert "database went away" in data["campaign"]["stopped"], data["campaign"]
    assert ended < 120, f"the campaign stopped {ended:.1f} s after the server froze (its --for was 600 s)"


def _worker_messages(db: str, tmp_path: Path) -> list[tuple[str, int, Any]]:
    """What one campaign worker (``_campaign._worker``, in a spawned process as a campaign starts it) sends."""
    import multiprocessing as mp

    from specproof.conformance._campaign import CampaignOptions, _worker

    options = CampaignOptions(
        plan={"subject": "drafter", "only": ("drafter.max-length",)}, db=db, hypothesis_dir=str(tmp_path / "hyp"),
        rounds=1,
    )  # fmt: skip
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=True)
    process = ctx.Process(target=_worker, args=(0, options, theirs), daemon=True)
    process.start()
    theirs.close()
    messages = []
    try:
        while ours.poll(120):
            message = ours.recv()
            messages.append(message)
            if message[0] == "done":
                break
    except EOFError:
        pass
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    return messages


def test_a_worker_starting_after_the_server_froze_reports_the_database_lost_not_its_own_failure(
    tmp_path: Path, redis_server: Any
) -> None:
    """The race a loaded machine found: one worker ran rounds, the server froze, the other worker was only then
    opening the database. The parent reached the server at start-up, so that is the database going away (the
    campaign stops on it, "database went away"), not the worker failing with a usage error."""
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        messages = _worker_messages(redis_server.url, tmp_path)
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    kinds = [kind for kind, _, _ in messages]
    assert kinds == ["lost", "done"], messages
    assert f"the shared database {redis_server.url} stopped answering" in messages[0][2], messages


def test_a_worker_on_an_answering_server_runs_its_round(tmp_path: Path, redis_server: Any) -> None:
    """The control: the same worker with the server answering runs its round and reports no loss."""
    kinds = [kind for kind, _, _ in _worker_messages(redis_server.url, tmp_path)]
    assert "lost" not in kinds and "error" not in kinds and kinds[-2:] == ["round", "done"], kinds
