"""``specproof.wire._lifetime``: a child tied to its parent ends when the parent is killed; one not
tied (the control) outlives it, which is what the tie is for; no tie from a thread that may end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from specproof.wire._lifetime import tie_to_parent

SRC = Path(__file__).resolve().parents[2] / "src"
pytestmark = pytest.mark.slow  # the control waits its 15 s: outside `tox -e quick`, always in `tox`

# a parent that starts `sleep` (tied or not), prints its pid, and waits to be killed
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from specproof.wire._lifetime import tie_to_parent
    preexec = tie_to_parent() if sys.argv[1] == "tied" else None
    child = subprocess.Popen(["sleep", "600"], preexec_fn=preexec)
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _outlives(mode: str) -> bool:
    """Whether the `sleep` a parent started in ``mode`` is still running 15 s after the parent's SIGKILL."""
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], env=env, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        return _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux' prctl")
def test_a_tied_child_dies_with_its_killed_parent_and_an_untied_one_does_not() -> None:
    assert not _outlives("tied")
    assert _outlives("untied")  # the control: without the tie, a killed parent leaves its child


def test_no_tie_from_a_thread_other_than_the_main_one() -> None:
    """The death signal follows the thread that started the child: from a thread that may end
    first, the child would be killed early, so no tie is asked for."""
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(tie_to_parent()))
    thread.start()
    thread.join()
    assert found == [None]
    if sys.platform.startswith("linux"):
        assert callable(tie_to_parent())
