"""Find leftover processes by their command line, read from /proc (psutil is not a test dependency)."""

from __future__ import annotations

import os
from pathlib import Path


def running_processes(tag: str) -> list[str]:
    """``"pid: command line"`` of each live process whose command line holds ``tag``.

    The pytest process itself (whose command line may name the tag) is left out, and so are
    zombies: a zombie has exited and holds nothing but its process-table entry until its parent
    reaps it. An engine orphaned by a finished ``certify`` child is reaped by init a moment
    later, so counting zombies would fail a test on a process that is already gone.

    Under pytest-xdist only processes started from this worker count (their environment holds
    the worker's ``PYTEST_XDIST_WORKER``, inherited even after they are orphaned): another
    worker's live engine running the same script is not this test's leftover.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            # the state follows the last ")": the command name in between may hold spaces or ")"
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone between listdir and read
        if tag in cmd and "pytest" not in cmd and state != "Z" and _started_by(pid, worker):
            found.append(f"{pid}: {cmd}")
    return found


def _started_by(pid: str, worker: str | None) -> bool:
    """Whether process ``pid`` was started under the xdist ``worker`` (any process when not under xdist)."""
    if worker is None:
        return True
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return True  # unreadable: count it rather than miss a leftover
    return f"PYTEST_XDIST_WORKER={worker}".encode() in environ
