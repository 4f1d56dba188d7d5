"""No process outlives a killed ``specproof certify`` or ``specproof fuzz``: the ``exec:`` engines
and the campaign's workers end with their parent, however it ends (SIGKILL, or SIGTERM, whose
default action runs no cleanup), and whatever they are doing (docs/fuzzing.md, "No process
outlives the campaign").

The engine that matters is a hung one: it answers the handshake, then on its first request
stops reading its stdin for ever, so the end of its stdin (all a killed parent leaves it) never
reaches it. A correct engine (``_wire_py_engine.py ok``) killed mid-run is checked as well.

Every process a run starts inherits a tag in its environment; after the kill, the test waits a
few seconds for every tagged process to be gone (read from /proc: psutil is no test dependency).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.slow,  # real certify and fuzz processes: outside `tox -e quick`, always in `tox`
    pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the processes through /proc (Linux)"),
]

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
#: how long what was stopped may take to be gone: a bound against a hang, generous for a loaded machine
#: (a passing test waits only until everything is gone)
GRACE = 60.0

HUNG_ENGINE = textwrap.dedent(
    """
    import json, os, sys, time
    HELLO = {"type": "hello", "protocol": "specproof-engine/1", "engine": {"name": "hung", "version": "0"},
             "vocab_size": 256, "max_context": 64, "k": 0, "rollback": "replay", "capabilities": ["greedy"]}
    print(json.dumps(HELLO), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["type"] in ("reset", "shutdown"):
            print(json.dumps({"type": "ok", "id": req["id"]}), flush=True)
            if req["type"] == "shutdown":
                break
            continue
        open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()  # hung from here on
        while True:
            time.sleep(1)
    """
)


def _tagged(tag: str) -> list[str]:
    """``pid: command line`` of each live (not zombie) process whose environment holds ``tag``."""
    found = []
    needle = f"SPECPROOF_LEFTOVER_TAG={tag}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                continue
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # gone between listdir and read
        if state != "Z":
            found.append(f"{pid}: {cmd.strip()}")
    return found


def _gone_within(tag: str, seconds: float) -> list[str]:
    """The tagged processes still running after ``seconds`` (none as soon as they are gone)."""
    deadline = time.monotonic() + seconds
    left = _tagged(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _tagged(tag)
    return left


def _kill_tagged(tag: str) -> None:
    """After the test, pass or fail: what it left is killed (by pid, each one it started)."""
    for line in _tagged(tag):
        try:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        except OSError:
            pass


def _start(args: list[str], tmp_path: Path, tag: str, *, stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SPECPROOF_LEFTOVER_TAG": tag, "OMP_NUM_THREADS": "1"}
    env["SPECPROOF_HYPOTHESIS_DIR"] = str(tmp_path / "hyp")
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "specproof", *args],
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not subprocess.DEVNULL else subprocess.DEVNULL,
    )


def _hung_engine(tmp_path: Path) -> tuple[str, Path]:
    script = tmp_path / "hung_engine.py"
    script.write_text(HUNG_ENGINE)
    markers = tmp_path / "hung"
    markers.mkdir()
    return "exec:" + shlex.join([sys.executable, str(script), str(markers)]), markers


def _wait_for(proc: subprocess.Popen[bytes], markers: Path, n: int) -> None:
    """Until ``n`` engines have hung on a request (a fixed sleep would race a slow start)."""
    deadline = time.monotonic() + 180
    while len(list(markers.iterdir())) < n:
        assert proc.poll() is None, f"exited with {proc.returncode} before {n} engine(s) hung"
        assert time.monotonic() < deadline, f"{n} engine(s) did not hang within 180 s"
        time.sleep(0.2)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_certify_leaves_no_hung_engine(tmp_path: Path, sig: signal.Signals) -> None:
    tag = uuid.uuid4().hex
    spec, markers = _hung_engine(tmp_path)
    proc = _start(["certify", "engine", "--engine", spec, "--only", "engine.stop", "--db", "none"], tmp_path, tag)
    try:
        _wait_for(proc, markers, 1)
        before = _tagged(tag)
        assert any("hung_engine.py" in line for line in before), before  # the check sees the engine
        proc.send_signal(sig)  # to certify alone, as `kill PID` and the out-of-memory killer do
        proc.wait(timeout=60)
        left = _gone_within(tag, GRACE)
    finally:
        _kill_tagged(tag)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert left == [], f"running before {sig.name}: {before}; still running {GRACE:g} s after: {left}"


def test_a_certify_killed_mid_run_leaves_no_engine(tmp_path: Path) -> None:
    """The Python test engine, correct, killed while certify drives it (any moment of a run)."""
    tag = uuid.uuid4().hex
    engine = "exec:" + shlex.join([sys.executable, str(TESTS / "_wire_py_engine.py"), "ok"])
    proc = _start(["certify", "engine", "--engine", engine, "--db", "none"], tmp_path, tag)
    try:
        deadline = time.monotonic() + 180
        while not any("_wire_py_engine.py" in line for line in _tagged(tag)):
            assert proc.poll() is None and time.monotonic() < deadline, "certify ended before its engine started"
            time.sleep(0.2)
        time.sleep(2)  # in the middle of the checks
        before = _tagged(tag)
        proc.kill()
        proc.wait(timeout=60)
        left = _gone_within(tag, GRACE)
    finally:
        _kill_tagged(tag)
    assert left == [], f"running before SIGKILL: {before}; still running {GRACE:g} s after: {left}"


def test_a_killed_campaign_leaves_no_worker_and_no_engine(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    spec, markers = _hung_engine(tmp_path)
    args = ["fuzz", "engine", "--engine", spec, "--only", "engine.stop", "--workers", "2", "--db", "none"]
    proc = _start(args, tmp_path, tag)
    try:
        _wait_for(proc, markers, 2)  # both workers in a check, each on its hung engine
        before = _tagged(tag)
        assert sum("spawn_main" in line for line in before) >= 2, before
        assert sum("hung_engine.py" in line for line in before) >= 2, before
        proc.kill()
        proc.wait(timeout=60)
        left = _gone_within(tag, GRACE)
    finally:
        _kill_tagged(tag)
    assert left == [], f"running before SIGKILL: {before}; still running {GRACE:g} s after: {left}"


def test_sigterm_to_certify_writes_the_partial_report_and_exits_143(tmp_path: Path) -> None:
    """SIGTERM (what CI timeouts send) is handled like Ctrl-C: the hung engine is stopped, the partial
    report (JSON and Markdown) is written with verdict INTERRUPTED, the verdict line is printed, exit 143."""
    tag = uuid.uuid4().hex
    spec, markers = _hung_engine(tmp_path)
    report, markdown, out = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "out.txt"
    args = ["certify", "engine", "--engine", spec, "--only", "engine.stop", "--db", "none"]
    args += ["--report", str(report), "--markdown", str(markdown)]
    with out.open("wb") as sink:
        proc = _start(args, tmp_path, tag, stdout=sink)
        try:
            _wait_for(proc, markers, 1)
            before = _tagged(tag)
            proc.send_signal(signal.SIGTERM)  # to certify alone, as `kill PID` and CI timeouts do
            proc.wait(timeout=60)
            left = _gone_within(tag, GRACE)
        finally:
            _kill_tagged(tag)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    printed = out.read_text()
    assert proc.returncode == 143, printed[-3000:]
    assert left == [], f"running before SIGTERM: {before}; still running {GRACE:g} s after: {left}"
    data = json.loads(report.read_text())
    assert data["verdict"] == "interrupted" and "SIGTERM" in data["verdict_reason"], data["verdict_reason"]
    assert "INTERRUPTED" in markdown.read_text()
    assert "verdict: INTERRUPTED" in printed and "SIGTERM" in printed, printed[-3000:]


SILENT_ENGINE = textwrap.dedent(
    """
    import os, sys, time
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()  # started; never says hello
    while True:
        time.sleep(1)
    """
)


def test_sigterm_while_loading_the_subjects_prints_the_verdict_and_exits_143(tmp_path: Path) -> None:
    """A SIGTERM during the engine's handshake (loading can take minutes) is told, never silent: no
    check ran, so no report can name its subjects; the verdict line says so and the engine is gone."""
    tag = uuid.uuid4().hex
    script = tmp_path / "silent_engine.py"
    script.write_text(SILENT_ENGINE)
    markers = tmp_path / "silent"
    markers.mkdir()
    spec = "exec:" + shlex.join([sys.executable, str(script), str(markers)])
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = _start(["certify", "engine", "--engine", spec, "--db", "none"], tmp_path, tag, stdout=sink)
        try:
            _wait_for(proc, markers, 1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            left = _gone_within(tag, GRACE)
        finally:
            _kill_tagged(tag)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    printed = out.read_text()
    assert proc.returncode == 143, printed[-3000:]
    assert "verdict: INTERRUPTED (SIGTERM while loading the subjects" in printed, printed[-3000:]
    assert "Traceback" not in printed, printed[-3000:]
    assert left == [], f"still running {GRACE:g} s after SIGTERM: {left}"
