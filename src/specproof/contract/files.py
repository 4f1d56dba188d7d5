"""The one way specproof writes a file the user named: checked before any work, written atomically.

``check_output_path`` is called when options are parsed (a missing parent directory, a
directory, an unwritable place: a ``UsageError`` naming the option; nothing is created);
``write_text_file`` writes to a temporary file beside the target and renames it over, so a
crash or Ctrl-C never leaves a half-written report, trace, history or baseline, and gives the
file the usual permissions (``0666 & ~umask``; a temporary file alone would be ``0600``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specproof.contract.errors import UsageError

__all__ = ["check_output_path", "write_text_file"]


def check_output_path(path: str | os.PathLike[str], *, option: str) -> Path:
    """The path an option names, if a file can be written there; else a one-line ``UsageError``."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"{option} {str(path)!r}: is a directory, expected a file path")
    if not parent.is_dir():
        raise UsageError(f"{option} {str(path)!r}: the directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"{option} {str(path)!r}: not writable")
    return target


def write_text_file(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` atomically with the usual permissions; ``OSError`` (with the path) on failure."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
