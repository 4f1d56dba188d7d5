"""Certify runs that several tests read, run once per test session (across pytest-xdist workers).

An in-process ``certify(...)`` without an example database (``db`` left at none, or ``"none"``) is a
pure function of its options (the profiles are derandomized): the same options give the same report
wherever they run. Tests that ask the very same run (one test reads the verdict, another the
certificate's notes, a third the markdown) share it here instead of each paying seconds for it: the
first asks, the others read its report from a file beside the workers' temporary directories. Each
reader gets a fresh ``Report`` (parsed again from the file), so no test sees another's changes.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specproof.conformance import Report, certify

_DEFAULTS = {name: p.default for name, p in inspect.signature(certify).parameters.items()}


class SharedRuns:
    """``certify(**options)`` once per session: the ``shared_runs`` fixture (tests/conftest.py)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def certify(self, subject: str | None = None, **options: Any) -> Report:
        if options.get("db") not in (None, "none"):
            raise ValueError("a run with an example database is not pure: certify it in the test")
        # options left at certify's defaults are left out: the same run however a test spells it
        asked = {name: value for name, value in options.items() if name not in _DEFAULTS or value != _DEFAULTS[name]}
        key = json.dumps({"subject": subject, **asked}, sort_keys=True)
        document = self.once(key, lambda: certify(subject, **options).to_json())
        return Report.from_json(document)

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` (JSON) the first time any worker asks for ``key``; its saved value after."""
        path = self.folder / f"shared-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
        with _locked(path.with_suffix(".lock")):
            if not path.is_file():
                written = path.with_suffix(f".{os.getpid()}")
                written.write_text(json.dumps(compute()))
                os.replace(written, path)  # whole or absent, for a reader that takes no lock
            return json.loads(path.read_text())  # the first asker reads what the others will


class _locked:
    """An exclusive lock on ``path`` between processes (POSIX ``flock``; elsewhere none: two workers
    may then both compute a run, slower and as correct)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock
