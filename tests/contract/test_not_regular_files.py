"""Every file a user hands the suite is read only if it is a regular file (issue 27): a FIFO, a
device or a directory given as a baseline, a session history, a trace, a golden file or an
``--expect-fail-file`` is a one-line error saying "not a regular file", before anything opens it
for reading in a way that could block (a FIFO without a writer) or read forever (``/dev/zero``).

A FIFO read the old way blocks until a writer comes; each test here has a watchdog that opens
the FIFO for writing after a few seconds and closes it, so a reader that blocked is released (it
then reads an empty file) and the test fails on what it got instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from specproof.bench import load_baseline
from specproof.bench._gate import BaselineError
from specproof.conformance._expected import load_expected_failures
from specproof.conformance.traces import GoldenFormatError, TraceFormatError, load_golden, read_trace
from specproof.contract import UsageError, files
from specproof.contract.files import read_bounded_text
from specproof.strategies import SessionFileError, SessionHistory

ROOT = Path(__file__).resolve().parents[2]
UNBLOCK_AFTER = 5.0  # seconds before the watchdog releases a reader that blocked on the FIFO

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX-only")


@contextmanager
def _fifo(tmp_path: Path) -> Iterator[tuple[Path, threading.Event]]:
    """A FIFO, and an event set when the watchdog had to release a reader blocked on it."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    done, released = threading.Event(), threading.Event()

    def watchdog() -> None:
        if done.wait(UNBLOCK_AFTER):
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO when nobody is reading: nothing to release
        except OSError:
            return
        released.set()
        os.close(fd)

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    try:
        yield path, released
    finally:
        done.set()
        thread.join()


def test_read_bounded_text_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    with _fifo(tmp_path) as (path, released):
        with pytest.raises(files.NotRegularFileError, match=r"not a regular file \(a FIFO\)") as info:
            read_bounded_text(path)
    assert not released.is_set(), "the read blocked on the FIFO until a writer came"
    assert isinstance(info.value, OSError) and info.value.filename == str(path)


def test_read_bounded_text_refuses_a_device_and_a_directory(tmp_path: Path) -> None:
    if os.path.exists("/dev/zero"):
        with pytest.raises(files.NotRegularFileError, match=r"a character device"):
            read_bounded_text("/dev/zero")
        link = tmp_path / "zero"
        link.symlink_to("/dev/zero")
        with pytest.raises(files.NotRegularFileError, match=r"a character device"):
            read_bounded_text(link)
    with pytest.raises(files.NotRegularFileError, match=r"a directory"):
        read_bounded_text(tmp_path)


def test_read_bounded_text_still_reads_a_regular_file_and_a_symlink_to_one(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_text("héllo\n", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(path)
    assert read_bounded_text(path) == read_bounded_text(link) == "héllo\n"


LOADERS: list[tuple[str, Callable[[Path], Any], type[Exception]]] = [
    ("baseline", load_baseline, BaselineError),
    ("session history", SessionHistory.load, SessionFileError),
    ("trace", read_trace, TraceFormatError),
    ("golden", load_golden, GoldenFormatError),
    ("--expect-fail-file", load_expected_failures, UsageError),
]


@pytest.mark.parametrize(("what", "load", "error"), LOADERS, ids=[w for w, _, _ in LOADERS])
def test_every_loader_says_a_fifo_is_not_a_regular_file(
    tmp_path: Path, what: str, load: Callable[[Path], Any], error: type[Exception]
) -> None:
    with _fifo(tmp_path) as (path, released):
        with pytest.raises(error) as info:
            load(path)
    assert not released.is_set(), f"the {what} loader blocked on the FIFO until a writer came"
    message = str(info.value)
    assert "not a regular file" in message and "FIFO" in message and str(path) in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--quick", "--drafter", "ngram", "--gate", "{fifo}"],
        ["certify", "--profile", "quick", "--only", "engine.session", "--replay-session", "{fifo}"],
    ],
    ids=["bench --gate", "certify --replay-session"],
)
def test_the_cli_refuses_a_fifo_with_a_usage_error(tmp_path: Path, argv: list[str]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "SPECPROOF_HYPOTHESIS_DIR": str(tmp_path / "hyp")}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "specproof", *(a.format(fifo=fifo) for a in argv)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
    except subprocess.TimeoutExpired:  # (the old behaviour: blocked on the FIFO forever)
        pytest.fail(f"specproof {argv[0]} blocked on a FIFO")
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "not a regular file" in proc.stderr and str(fifo) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
