"""Child processes that do not outlive their parent: ``exec:`` engines and campaign workers.

A parent killed with SIGKILL (or SIGTERM, whose default action runs no cleanup) cannot stop its
children, and a child that is busy or hung never reads the end of its stdin. On Linux the kernel
does it: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the child sends it SIGKILL the moment the thread
that started it ends — every process of a ``certify`` or ``fuzz`` run goes with its parent,
whatever state it is in, with nothing left to poll.

Why the death signal, not a process group: a group is only killed whole by whoever signals it
(a shell's job control, a CI runner that kills the group); ``kill -9 PID`` of the parent alone —
and the out-of-memory killer — reach the parent only. Why not only a watchdog reading a pipe from
the parent: a watchdog is a thread in the child, and an engine is any program (``exec:``), not
ours to add threads to. The campaign's workers, which are ours, have the watchdog too
(``exit_with_parent``), so they also follow their parent where there is no ``prctl`` (macOS).

The death signal follows the *thread* that started the child: a child started from a short-lived
thread would be killed when that thread ends, so ``tie_to_parent`` asks for it only when the child
is started from the main thread (an engine started elsewhere still ends when its stdin closes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["die_with_parent", "exit_with_parent", "tie_to_parent"]

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_prctl = _load_prctl()  # loaded before any fork: the child only calls it


def die_with_parent(parent: int | None = None) -> bool:
    """In a child process: be sent SIGKILL when the parent (the thread that started it) ends.

    ``parent``: the parent's pid seen before the fork; if the parent has already ended (the child
    was re-parented before the call), the child kills itself at once. True when the kernel took it.
    """
    if _prctl is None or _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:  # the parent died before the prctl
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def tie_to_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that ties the child to this process (Linux, from
    the main thread); None where it cannot (another OS or thread: the child then ends on stdin EOF)."""
    if _prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def preexec() -> None:  # after fork, before exec: only the prctl call and getppid
        die_with_parent(parent)

    return preexec


def exit_with_parent(sentinel: int) -> threading.Thread:
    """A daemon thread in a child that ends the child (``os._exit``) once ``sentinel`` — a file
    descriptor that becomes readable when the parent ends, e.g. ``multiprocessing.parent_process()
    .sentinel`` — is readable: the portable tie, for children that run our own code."""
    from multiprocessing.connection import wait

    def watch() -> None:
        wait([sentinel])
        os._exit(1)

    thread = threading.Thread(target=watch, name="specproof-exit-with-parent", daemon=True)
    thread.start()
    return thread
