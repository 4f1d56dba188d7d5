"""How lines travel to and from an engine: a process's stdin/stdout (its stderr kept as a tail), or a TCP
connection; every line read is bounded (``LineTooLong`` past the limit), by a reader thread that feeds a
small queue, so a hung or flooding engine costs at most a timeout and ``limit`` bytes.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
from typing import IO

from specproof.wire._errors import EngineProtocolError
from specproof.wire._lifetime import tie_to_parent
from specproof.wire._limits import LineTooLong

__all__ = ["LineReader", "ProcessTransport", "SocketTransport", "Transport"]

_EOF = object()


class LineReader:
    """A daemon thread that reads lines from ``stream`` into a small queue (``_EOF`` at the end).

    Lines are cut from chunks as bytes arrive; a line that grows past ``limit`` bytes without
    a newline is reported at once (``LineTooLong``) and reading stops, so an engine that
    floods its stdout costs at most ``limit`` bytes here. The queue holds a few lines: an
    engine that writes faster than the suite reads is held back by the pipe.
    """

    def __init__(self, stream: IO[bytes], name: str, *, limit: int) -> None:
        self.limit = limit
        self.queue: queue.Queue[object] = queue.Queue(maxsize=4)
        self._stream = stream
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self.queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        buf = bytearray()
        read = getattr(self._stream, "read1", None) or self._stream.read
        try:
            while not self._stop.is_set():
                chunk = read(1 << 16)
                if not chunk:
                    break
                start = 0
                while True:
                    nl = chunk.find(b"\n", start)
                    piece = chunk[start:] if nl < 0 else chunk[start:nl]
                    if len(buf) + len(piece) > self.limit:
                        buf += piece[: self.limit + 1 - len(buf)]
                        self._put(LineTooLong(len(buf), self.limit, bytes(buf[:4096])))
                        return  # stop reading: the engine is closed by the client
                    buf += piece
                    if nl < 0:
                        break
                    line = buf.decode("utf-8", errors="replace").rstrip("\r")
                    buf = bytearray()
                    if not self._put(line):
                        return
                    start = nl + 1
        except (OSError, ValueError):
            pass
        finally:
            self._put(_EOF)

    def get(self, timeout: float) -> str | None:
        """The next line; None at end of stream; raises ``queue.Empty`` after ``timeout`` seconds and
        ``LineTooLong`` for a line past the limit."""
        item = self.queue.get(timeout=timeout)
        if item is _EOF:
            with contextlib.suppress(queue.Full):
                self.queue.put_nowait(_EOF)  # every later read sees the end too
            return None
        if isinstance(item, LineTooLong):
            with contextlib.suppress(queue.Full):
                self.queue.put_nowait(item)
            raise item
        assert isinstance(item, str)
        return item

    def stop(self) -> None:
        self._stop.set()


class Transport:
    describe = "engine"
    _lines: LineReader

    def send(self, line: str) -> None:
        raise NotImplementedError

    def recv(self, timeout: float) -> str | None:
        return self._lines.get(timeout)

    def set_limit(self, limit: int) -> None:
        self._lines.limit = limit

    def exit_note(self) -> str:
        return "the engine closed the connection"

    @property
    def stderr_tail(self) -> str:
        return ""

    def settle_stderr(self) -> None:
        """Let the stderr reader take what the engine has already written (nothing to do over TCP)."""

    def close(self, timeout: float) -> None:
        raise NotImplementedError


def _status_text(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"the engine was killed by signal {-code} ({name})"
    return f"the engine exited with status {code}"


class ProcessTransport(Transport):
    def __init__(self, argv: list[str], *, cwd: str | None, env: dict[str, str] | None, limit: int) -> None:
        self.argv = argv
        self.describe = "exec:" + shlex.join(argv)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                bufsize=-1,
                preexec_fn=tie_to_parent(),  # SIGKILL when certify ends, even killed (Linux; _lifetime.py)
            )
        except OSError as exc:
            raise EngineProtocolError(f"engine {self.describe}: cannot start it: {exc}") from exc
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._lines = LineReader(self.proc.stdout, "specproof-wire-stdout", limit=limit)
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, name="specproof-wire-stderr", daemon=True)
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            while True:
                raw = self.proc.stderr.readline(4096)  # bounded: an endless stderr line is cut, never hoarded
                if not raw:
                    break
                self._stderr.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        except (OSError, ValueError):
            pass

    @property
    def stderr_tail(self) -> str:
        return "\n".join(self._stderr)[-4000:]

    def settle_stderr(self, timeout: float = 0.5) -> None:
        """Wait (at most ``timeout``) until the stderr reader has taken what is already in the pipe.

        A fault is often noticed on stdout before the reader thread has run (seen on a loaded CI
        runner: the engine's first stderr line missing from the report), and the tail is the clue
        the report exists to give. Nothing is read here: the pipe belongs to the reader thread.
        """
        stream = self.proc.stderr
        if stream is None or not self._stderr_thread.is_alive():
            return
        deadline = time.monotonic() + timeout
        try:
            fd = stream.fileno()
            while time.monotonic() < deadline and select.select([fd], [], [], 0)[0]:
                time.sleep(0.005)
        except (OSError, ValueError):
            return
        time.sleep(0.02)  # the reader has the bytes; let it append them

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode("utf-8") + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise EngineProtocolError(f"cannot write to the engine: {exc}; {self.exit_note()}") from None

    def exit_note(self) -> str:
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "the engine closed its stdout but is still running"
        self._stderr_thread.join(timeout=1.0)
        return _status_text(code)

    def close(self, timeout: float) -> None:
        proc = self.proc
        self._lines.stop()
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
        for stream in (proc.stdout, proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()


class SocketTransport(Transport):
    def __init__(self, host: str, port: int, *, timeout: float, limit: int) -> None:
        self.describe = f"tcp:{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise EngineProtocolError(f"engine {self.describe}: cannot connect: {exc}") from exc
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self.sock.makefile("rb")
        self._lines = LineReader(self._file, "specproof-wire-tcp", limit=limit)

    def send(self, line: str) -> None:
        try:
            self.sock.sendall(line.encode("utf-8") + b"\n")
        except OSError as exc:
            raise EngineProtocolError(f"cannot write to the engine: {exc}") from None

    def close(self, timeout: float) -> None:
        self._lines.stop()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            self.sock.close()
