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
    """
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
        if tag in cmd and "pytest" not in cmd and state != "Z":
            found.append(f"{pid}: {cmd}")
    return found
