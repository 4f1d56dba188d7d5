"""The leftover-process finder the wire tests use: it sees a live process and not a zombie."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

from _processes import running_processes


def test_finds_a_live_process_by_tag_and_not_once_it_has_exited() -> None:
    tag = f"tag-{uuid.uuid4().hex}"
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(60)", tag])
    try:
        # until its exec, a child's command line is its parent's (pytest's): wait for the tag to appear
        deadline = time.monotonic() + 60.0
        while tag not in Path(f"/proc/{child.pid}/cmdline").read_bytes().decode(errors="replace"):
            assert time.monotonic() < deadline, "the child never ran its command"
            time.sleep(0.01)
        found = running_processes(tag)
        assert len(found) == 1 and found[0].startswith(f"{child.pid}: ") and tag in found[0]
        assert running_processes(f"tag-{uuid.uuid4().hex}") == []  # another tag: nothing
        child.kill()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # killed, not yet reaped: a zombie until wait()
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the killed child never became a zombie")
        assert running_processes(tag) == []  # exited: not running, whoever reaps it
    finally:
        child.kill()
        child.wait(timeout=5)
    assert running_processes(tag) == []
