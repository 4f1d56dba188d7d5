"""Helpers shared by the wire tests (tests/test_wire_*.py, tests/wire/test_native_engine.py).

The test engines are Python scripts beside this file: ``FAKE`` (canned conversations),
``HOSTILE`` (bounds-breaking engines) and ``PY_ENGINE`` (a whole engine with planted bugs). They
are started as ``ExecEngine`` s (``start``), named by ``exec:`` specs (``exec_spec``), and certified
in-process (``certify_engine``: no engine process may be left running) or through the command
line in a child process (``certify_command``: exit status, output, seconds, peak memory).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from _assertions import by_invariant as by_invariant  # re-exported for the wire tests
from _assertions import report_json
from _processes import running_processes
from specproof.conformance import certify
from specproof.wire import ExecEngine

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FAKE = TESTS / "_wire_fake_engine.py"
HOSTILE = TESTS / "_wire_hostile_engine.py"
PY_ENGINE = TESTS / "_wire_py_engine.py"

# the native engine's certify runs (greedy and sampled): seconds each over the wire, run by the tox native env
slow_certify = pytest.mark.skipif(
    os.environ.get("SPECPROOF_NATIVE_CERTIFY") != "1",
    reason="certify runs over the wire take ~5 s each; set SPECPROOF_NATIVE_CERTIFY=1 (the tox native env does)",
)


def argv(script: Path, *args: str) -> list[str]:
    """The command that runs a Python test engine ``script`` with ``args``."""
    return [sys.executable, str(script), *args]


def exec_spec(script: Path, *args: str) -> str:
    """The ``exec:`` engine spec of ``argv(script, *args)``."""
    return "exec:" + shlex.join(argv(script, *args))


def start(script: Path, *args: str, **options: Any) -> ExecEngine:
    """``ExecEngine`` over the test engine ``script`` (``options``: ExecEngine's, e.g. ``timeout=5.0``)."""
    return ExecEngine(argv(script, *args), **options)


def certify_engine(script: Path, mode: str, *, only: tuple[str, ...], **options: Any) -> dict[str, Any]:
    """``certify("engine")`` at the quick profile against the test engine ``script`` in ``mode``
    (``options``: certify's, e.g. ``drafter=``); fails when an engine process is left running."""
    report = certify("engine", engine=exec_spec(script, mode), profile="quick", only=only, **options)
    assert running_processes(str(script)) == [], "an engine process was left running"
    return report_json(report)


# Linux starts a new program's peak-RSS figure at its parent's peak (exec keeps the old memory map's
# high-water mark), so a certify started straight from this pytest process reports pytest's own peak
# (seen in CI: 1049 MB, after a thousand tests). A small Python in between starts certify and reports
# the figure of certify alone (with the engine processes it waited for).
_MEASURE = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "print(f'\\nspecproof-test-peak-rss-kib {usage.ru_maxrss}', flush=True)\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


@attrs.frozen
class Certified:
    """What a ``specproof certify`` child did: exit status, output (stdout and stderr), seconds, peak RSS (bytes)."""

    returncode: int
    output: str
    seconds: float
    peak_rss: int


def certify_command(args: list[str], *, timeout: float, env: dict[str, str] | None = None) -> Certified:
    """Run ``specproof certify ARGS`` (this checkout's sources) in a child; killed with its engines, and
    the test failed, past ``timeout`` seconds. ``env`` adds environment variables."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", **(env or {})}
    command = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "specproof", "certify", *args]
    started = time.monotonic()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environ, start_new_session=True
    )
    try:
        raw, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raw, _ = proc.communicate()
        raise AssertionError(f"certify ran past {timeout:g} s: {raw.decode(errors='replace')[-2000:]}") from None
    seconds = time.monotonic() - started
    out, marker, peak = raw.decode(errors="replace").rpartition("\nspecproof-test-peak-rss-kib ")
    assert marker, f"no peak RSS reported: {peak[-2000:]}"
    return Certified(proc.returncode, out, seconds, int(peak.split()[0]) * 1024)
