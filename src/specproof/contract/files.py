"""The one way specproof writes a file the user named (checked before any work, written
atomically), and the one way it reads one back (bounded in size and JSON depth).

``check_output_path`` is called when options are parsed (a missing parent directory, a
directory, an unwritable place: a ``UsageError`` naming the option; nothing is created);
``write_text_file`` writes to a temporary file beside the target and renames it over, so a
crash or Ctrl-C never leaves a half-written report, trace, history or baseline, and gives the
file the usual permissions (``0666 & ~umask``; a temporary file alone would be ``0600``).

``read_bounded_text`` refuses what is not a regular file (a FIFO, a device, a directory: never
read, so a FIFO cannot hang the run) and a file past a size limit before reading it, and
``loads_bounded`` refuses JSON nested deeper than a limit before decoding it (never a
``RecursionError``): a session history, trace, golden file or baseline a user hands the suite
is either one the suite could have written or a one-line error naming the file.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, Final

from specproof.contract.errors import UsageError

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_USER_FILE_BYTES",
    "FileTooLargeError",
    "NotRegularFileError",
    "check_output_path",
    "json_depth_exceeds",
    "loads_bounded",
    "read_bounded_text",
    "write_text_file",
]

#: the largest session history, golden file or baseline read back (the suite writes kilobytes)
MAX_USER_FILE_BYTES: Final = 64 << 20
#: the deepest JSON nesting read back (the suite's formats nest at most 5 deep)
MAX_JSON_DEPTH: Final = 64

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN: Final = (ord("["), ord("{"))
_CLOSE: Final = (ord("]"), ord("}"))


class FileTooLargeError(ValueError):
    """``read_bounded_text``: the file is larger than the limit (``size`` and ``limit`` in bytes)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes, more than the limit of {limit} bytes")
        self.size, self.limit = size, limit


class NotRegularFileError(OSError):
    """``read_bounded_text``: the path is not a regular file (``kind``: "a FIFO", "a directory", ...).

    An ``OSError`` whose ``strerror`` reads "not a regular file (a FIFO)", so every caller that
    reports ``OSError`` as "cannot read FILE (why)" names it without a change."""

    def __init__(self, path: str | os.PathLike[str], mode: int) -> None:
        self.kind = file_kind(mode)
        super().__init__(errno.EINVAL, f"not a regular file ({self.kind})", os.fspath(path))


def file_kind(mode: int) -> str:
    """What an ``st_mode`` that is not a regular file's is, in words ("a FIFO", "a directory", ...)."""
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def read_bounded_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_USER_FILE_BYTES) -> str:
    """The UTF-8 text of ``path``; ``NotRegularFileError`` (an ``OSError``) for a FIFO, a device, a
    directory, checked before reading (opened non-blocking, so a FIFO without a writer never
    blocks); ``FileTooLargeError`` (a ``ValueError``) past ``max_bytes``, checked before reading;
    ``OSError`` / ``UnicodeDecodeError`` as ``Path.read_text`` raises them."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(path, mode)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise FileTooLargeError(size, max_bytes)
        raw = fh.read(max_bytes + 1)  # a file that grew meanwhile is cut off here, not read whole
    if len(raw) > max_bytes:
        raise FileTooLargeError(len(raw), max_bytes)
    return raw.decode("utf-8")


def json_depth_exceeds(text: str, max_depth: int) -> bool:
    """Whether ``[``/``{`` outside JSON strings nest deeper than ``max_depth`` (linear, no recursion)."""
    if text.count("[") + text.count("{") <= max_depth:  # cheap: most documents stop here
        return False
    import numpy as np

    stripped = _STRING.sub("", text).encode("utf-8", errors="replace")
    depth = 0
    step = 1 << 20
    for start in range(0, len(stripped), step):
        chunk = np.frombuffer(stripped[start : start + step], dtype=np.uint8)
        delta = np.isin(chunk, _OPEN).astype(np.int32) - np.isin(chunk, _CLOSE).astype(np.int32)
        running = depth + np.cumsum(delta)
        if running.size and int(running.max()) > max_depth:
            return True
        depth = int(running[-1]) if running.size else depth
    return False


def loads_bounded(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` after a depth check: ``ValueError`` naming the limit for deeper JSON;
    ``json.JSONDecodeError`` for invalid JSON (line and column); never ``RecursionError``."""
    if json_depth_exceeds(text, max_depth):
        raise ValueError(f"JSON nested more than {max_depth} deep (the limit)")
    try:
        return json.loads(text)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise ValueError(f"JSON nested too deep to decode (limit {max_depth})") from None


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
