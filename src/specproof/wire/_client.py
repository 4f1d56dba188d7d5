"""The client side of ``specproof-engine/1``: an external engine process as a specproof engine.

``ExecEngine("CMD ARGS")`` starts the engine and talks JSON Lines over its stdin/stdout;
``TcpEngine(host, port)`` connects to one already listening. Both are ``WireEngine`` s,
which implement the engine contract the suite consumes: ``generate`` (white-box: every
round's ``Step`` and the ``Stats``), ``greedy`` (capability ``greedy``), the settable
``drafter`` (capability ``suite_drafts``: the engine asks for every draft with ``propose``;
with ``features``, a feature drafter gets the rows the engine sent: docs/protocol.md, Features),
``target`` (capability ``state``: a live view of the state the engine last reported),
``oracle`` (the target spec the handshake names), ``reset`` and ``close``.

Every message received is validated against its JSON Schema; anything wrong (invalid JSON,
a schema violation, an unexpected message, the engine exiting, no answer within
``timeout`` seconds) raises ``EngineProtocolError`` naming the engine, the request, the
last message received and the engine's stderr tail. A reader thread feeds a queue, so a
hung engine costs at most ``timeout`` seconds, never a hang.
"""

from __future__ import annotations

import atexit
import base64
import collections
import contextlib
import hashlib
import json
import os
import queue
import secrets
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NoReturn

import numpy as np
import numpy.typing as npt

from specproof.contract import states_differ
from specproof.engine import Generation, Stats, Step, Target
from specproof.engine.targets import load_target as load_engine_target
from specproof.wire._digest import digest_bound, projections, slice_length
from specproof.wire._errors import EngineProtocolError, EngineRequestError
from specproof.wire._limits import (
    HANDSHAKE_LINE_BYTES,
    NO_STATE_LINE_BYTES,
    STATE_LINE_BYTES,
    LineTooLong,
    check_array_shape,
    check_digest_shape,
    check_feature_shape,
    check_handshake_sizes,
    feature_line_bytes,
    message_kind,
    parse_line,
    state_line_bytes,
)
from specproof.wire._schemas import validate_message

__all__ = ["DEFAULT_TIMEOUT", "ExecEngine", "TcpEngine", "WireEngine", "WireTargetView", "engine_from_spec"]

DEFAULT_TIMEOUT = 60.0
_EOF = object()
_SHOW = 300  # characters of a message quoted in an error


def _clip(text: str, n: int = _SHOW) -> str:
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


# --------------------------------------------------------------------------- transports


class _LineReader:
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


class _Transport:
    describe = "engine"
    _lines: _LineReader

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


class _ProcessTransport(_Transport):
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
            )
        except OSError as exc:
            raise EngineProtocolError(f"engine {self.describe}: cannot start it: {exc}") from exc
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._lines = _LineReader(self.proc.stdout, "specproof-wire-stdout", limit=limit)
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


class _SocketTransport(_Transport):
    def __init__(self, host: str, port: int, *, timeout: float, limit: int) -> None:
        self.describe = f"tcp:{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise EngineProtocolError(f"engine {self.describe}: cannot connect: {exc}") from exc
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self.sock.makefile("rb")
        self._lines = _LineReader(self._file, "specproof-wire-tcp", limit=limit)

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


# --------------------------------------------------------------------------- the live view


#: what each axis of the reference family's state arrays indexes (names a slice in a digest mismatch)
_AXIS_NAMES: dict[str, tuple[str, ...]] = {
    "key_cache": ("layer", "head", "position", "dim"),
    "value_cache": ("layer", "head", "position", "dim"),
    "conv_state": ("layer", "channel", "tap"),
    "rec_state": ("layer", "head", "key", "value"),
}
#: the key of the digest seeds, to draw a digest failure's signs again in another run (32 hex digits);
#: never passed on to an engine process
DIGEST_KEY_ENV = "SPECPROOF_WIRE_DIGEST_KEY"

_FULL_HINT = (
    "rerun with whole arrays for the element-level detail: $SPECPROOF_WIRE_STATE=full "
    "(full_state=True on ExecEngine/TcpEngine)"
)


def _float32(text: str, shape: Sequence[int], what: str) -> tuple[bytes, npt.NDArray[np.float32]]:
    """Base64 of little-endian float32 values (its length already checked against ``shape``): the raw
    bytes and the array; text that is not base64 is an ``EngineProtocolError`` naming ``what``."""
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise EngineProtocolError(f"{what} is not base64 ({exc})") from None
    return raw, np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(tuple(shape))


def _slice_text(name: str, index: tuple[int, ...]) -> str:
    names = _AXIS_NAMES.get(name, ())
    return ", ".join(f"{names[k] if k < len(names) else f'axis {k}'} {i}" for k, i in enumerate(index))


class _Digest:
    """What the client holds of one digested array: the projections of every slice of the request so far."""

    def __init__(self, shape: tuple[int, ...], slice_axes: int, proj: npt.NDArray[np.float32], crc: int) -> None:
        self.shape, self.slice_axes, self.proj, self.crc = shape, slice_axes, proj, crc
        self.axis: int | None = None
        #: slices from this index along ``axis`` (all of them when ``axis`` is None) not yet compared
        self.unchecked_from = 0
        self.checked = False


class WireTargetView:
    """The state the engine last reported: ``processed`` and ``state_arrays()`` (read-only view).

    With ``state_delta`` (docs/protocol.md, ``state``) an array may carry only the indices from
    ``start`` along ``axis``; the rest is taken from the same request's previous state message,
    and the whole array's CRC-32 must equal the engine's. A mismatch means rows the client holds
    changed in the engine since it reported them: ``state_problem`` says so, and the state
    checks report it on ``engine.state-restored``.

    With ``state_digest`` an array may come as signed projections per slice instead of its values
    (``_digest``): ``state_arrays()`` cannot give it, and ``state_differs(expected, atol=)`` — which
    the state checks call — compares the digests with the reference's.
    """

    def __init__(self, vocab_size: int, max_context: int, name: str) -> None:
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.name = f"{name} (live state over the wire)"
        self.processed = 0
        self._arrays: dict[str, npt.NDArray[np.float32]] = {}
        self._digests: dict[str, _Digest] = {}
        self.updates = 0
        #: the arrays a delta may build on (this request's previous state message; none at its start)
        self._base: dict[str, npt.NDArray[np.float32]] = {}
        #: the previous state message's (shape, whole CRC-32) per array: what a digest's prefix must equal
        self._prev: dict[str, tuple[tuple[int, ...], int]] = {}
        #: the client's digest key, in hex: a failure names it so another run can draw the same signs
        self.digest_key: str | None = None
        #: this request's digest parameters (seed, projections per slice), None without state_digest
        self.digest: tuple[int, int] | None = None
        #: why the arrays are not the engine's state (a CRC-32 mismatch), or None
        self.state_problem: str | None = None
        #: arrays sent as deltas, and the rows (indices along the axis) they left out
        self.delta_arrays = 0
        self.rows_left_out = 0
        #: arrays sent as digests, slices compared by digest, and arrays accepted by their CRC-32 alone
        self.digest_arrays = 0
        self.digest_slices_compared = 0
        self.digest_crc_matches = 0

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        if self._digests:
            raise ValueError(
                f"{self.name}: the engine sent digests of {sorted(self._digests)}, not their values "
                "(state_digest): compare with state_differs(expected, atol=...), or ask for whole arrays "
                "with full_state=True or $SPECPROOF_WIRE_STATE=full"
            )
        return {name: array.copy() for name, array in self._arrays.items()}

    def fingerprint(self) -> object:
        """What changes when the engine's reported state does, whatever way it travels (digests carry no
        values): ``processed``, each whole array's bytes, each digested array's CRC-32 and sums."""
        whole = tuple((name, a.tobytes()) for name, a in sorted(self._arrays.items()))
        digested = tuple((name, d.crc, d.proj.tobytes()) for name, d in sorted(self._digests.items()))
        return (self.processed, whole, digested)

    def clear(self) -> None:
        self.processed = 0
        self._arrays = {}
        self._digests = {}
        self._base = {}
        self._prev = {}
        self.state_problem = None

    def begin_request(self, *, digest: tuple[int, int] | None = None) -> None:
        """A new request: its first state message must be whole (deltas build on this request only)."""
        self._base = {}
        self._prev = {}
        self.digest = digest
        self.state_problem = None

    def state_differs(self, expected: Mapping[str, npt.ArrayLike], *, atol: float) -> str | None:
        """None when the reported state can be the reference's ``expected`` within ``atol``; else why not.

        Whole arrays are compared element-wise (``specproof.contract.states_differ``). A digested
        array must have the reference's exact shape; then its CRC-32 equal to the reference's accepts
        it outright (bit-identical), and otherwise every slice not compared yet in this request (KV:
        the rows sent since the last comparison) must have each projection within
        ``digest_bound`` of the reference's. Every test is a necessary condition of ``within atol``.
        """
        if self.state_problem:
            return self.state_problem
        names = set(self._arrays) | set(self._digests)
        if names != set(expected):
            return f"state names {sorted(names)} != expected {sorted(expected)}"
        whole = {n: expected[n] for n in self._arrays}
        problems = []
        if whole and (why := states_differ(whole, self._arrays, atol=atol)):
            problems.append(why)
        for name, held in self._digests.items():
            if why := self._digest_differs(name, held, np.asarray(expected[name]), atol):
                problems.append(why)
        return "; ".join(problems) if problems else None

    def _digest_differs(self, name: str, held: _Digest, want: npt.NDArray[Any], atol: float) -> str | None:
        if tuple(want.shape) != held.shape:
            return f"{name} has shape {held.shape}, expected {tuple(want.shape)}"
        if held.checked:
            return None
        if zlib.crc32(np.ascontiguousarray(want, dtype="<f4").tobytes()) == held.crc:
            # bit-identical to the reference, the engine says; the sums are compared all the same: a CRC
            # taken from another buffer than the sums (a copy before the rollback) must not excuse them
            self.digest_crc_matches += 1
        assert self.digest is not None
        seed, n = self.digest
        start = held.unchecked_from if held.axis is not None else 0
        ref, norm = projections(want, seed=seed, n=n, slice_axes=held.slice_axes, axis=held.axis, start=start)
        got = held.proj.astype(np.float64)
        if held.axis is not None and start:
            got = np.take(got, np.arange(start, got.shape[held.axis]), axis=held.axis)
        m = slice_length(held.shape, held.slice_axes)
        bound = digest_bound(norm, atol=atol, m=m)[..., None]
        with np.errstate(invalid="ignore"):
            # NaN or inf in the reference slice: the engine's projection must be non-finite too
            close = np.where(np.isfinite(ref), np.abs(got - ref) <= bound, ~np.isfinite(got))
        self.digest_slices_compared += int(norm.size)
        if close.all():
            held.checked = True
            return None
        bad = np.argwhere(~close)
        where = tuple(int(i) for i in bad[0])
        index = list(where[:-1])
        if held.axis is not None:
            index[held.axis] += start
        j = where[-1]
        gap, limit = abs(float(got[where]) - float(ref[where])), float(bound[where[:-1]][0])
        slices = len({tuple(b[:-1]) for b in bad.tolist()})
        return (
            f"{name} differs at {_slice_text(name, tuple(index))} (a slice of {m} elements): signed projection "
            f"{j} is {float(got[where]):.9g} in the engine, {float(ref[where]):.9g} in the reference, "
            f"|difference| {gap:.3g} > the bound {limit:.3g} "
            f"(atol {atol:g} x {m} + float slack); {slices} of {int(norm.size)} slices compared differ, so some "
            f"element differs by more than atol (certain, whatever the engine's float arithmetic; state_digest, "
            f"seed {seed}"
            + (f"; the same signs in another run: ${DIGEST_KEY_ENV}={self.digest_key}" if self.digest_key else "")
            + f"); {_FULL_HINT}"
        )

    def update(self, message: dict[str, Any], *, delta: bool = False) -> None:
        arrays: dict[str, npt.NDArray[np.float32]] = {}
        digests: dict[str, _Digest] = {}
        prev: dict[str, tuple[tuple[int, ...], int]] = {}
        problems: list[str] = []
        for name, spec in message["arrays"].items():
            full_shape = [int(n) for n in spec["shape"]]
            if "digest" in spec:
                if "data" in spec:
                    raise EngineProtocolError(f"state array {name!r}: both data and a digest")
                held = self._read_digest(name, spec, full_shape, message, problems)
                digests[name] = held
                prev[name] = (held.shape, held.crc)
                continue
            if "data" not in spec:
                raise EngineProtocolError(f"state array {name!r}: neither data nor a digest")
            if "prefix_crc32" in spec or "slice" in spec:
                raise EngineProtocolError(f"state array {name!r}: prefix_crc32 or slice without a digest")
            start = spec.get("start")
            if start is None:
                shape = check_array_shape(name, full_shape, spec["data"])
            else:
                if not delta:
                    raise EngineProtocolError(
                        f"state array {name!r}: 'start' (a delta), but the request did not ask for state_delta"
                    )
                axis, start = int(spec["axis"]), int(start)
                base = self._base.get(name)
                if axis >= len(full_shape):
                    raise EngineProtocolError(f"state array {name!r}: axis {axis} of a shape {full_shape[:12]}")
                if base is None:
                    raise EngineProtocolError(
                        f"state array {name!r}: a delta (start {start}) with no earlier state message of this "
                        "request to build on (the first state message of a request is whole)"
                    )
                kept = [n for i, n in enumerate(base.shape) if i != axis]
                if kept != [n for i, n in enumerate(full_shape) if i != axis] or not (
                    start <= min(base.shape[axis], full_shape[axis])
                ):
                    raise EngineProtocolError(
                        f"state array {name!r}: a delta of shape {full_shape[:12]} from {start} along axis {axis} "
                        f"does not extend the previous message's shape {list(base.shape)}"
                    )
                part = full_shape.copy()
                part[axis] -= start
                check_array_shape(name, part, spec["data"])
                shape = tuple(full_shape)
            raw, new = _float32(spec["data"], shape if start is None else part, f"state array {name!r}: data")
            if start is None:
                arrays[name] = new
                prev[name] = (shape, zlib.crc32(raw))
                continue
            old = np.take(self._base[name], np.arange(start), axis=axis)
            whole = np.ascontiguousarray(np.concatenate([old, new], axis=axis), dtype="<f4")
            self.delta_arrays += 1
            self.rows_left_out += start
            crc = zlib.crc32(whole.tobytes())
            if crc != int(spec["crc32"]):
                problems.append(
                    f"state array {name!r} at processed={message['processed']}: the engine's CRC-32 "
                    f"{int(spec['crc32']):#010x} is not that of the {start} rows it sent before plus the "
                    f"{full_shape[axis] - start} it sent now ({crc:#010x}): rows before {start} changed after "
                    "it reported them (append-only KV; docs/contract.md), or the CRC is wrong"
                )
            arrays[name] = whole.astype(np.float32)
            prev[name] = (shape, crc)
        self._arrays = arrays
        self._digests = digests
        self._base = arrays
        self._prev = prev
        self.processed = int(message["processed"])
        self.updates += 1
        if problems and self.state_problem is None:
            self.state_problem = "; ".join(problems)

    def _read_digest(
        self, name: str, spec: dict[str, Any], full_shape: list[int], message: dict[str, Any], problems: list[str]
    ) -> _Digest:
        """A digested array (docs/protocol.md, state): checked, decoded and joined to the request's earlier slices."""
        if self.digest is None:
            raise EngineProtocolError(f"state array {name!r}: a digest, but the request did not ask for state_digest")
        if "crc32" not in spec:
            raise EngineProtocolError(f"state array {name!r}: a digest needs crc32 (the whole array's CRC-32)")
        slice_axes = int(spec.get("slice", 1))
        start = spec.get("start")
        axis = None if start is None else int(spec["axis"])
        start = 0 if start is None else int(start)
        if axis is not None and "prefix_crc32" not in spec:
            raise EngineProtocolError(f"state array {name!r}: a digest from start {start} needs prefix_crc32")
        if axis is None and "prefix_crc32" in spec:
            raise EngineProtocolError(f"state array {name!r}: prefix_crc32 without start")
        part = check_digest_shape(
            name,
            full_shape,
            slice_axes=slice_axes,
            projections=self.digest[1],
            axis=axis,
            start=start,
            data=spec["digest"],
        )
        _, proj = _float32(spec["digest"], part, f"state array {name!r}: digest")
        shape, crc = tuple(full_shape), int(spec["crc32"])
        self.digest_arrays += 1
        if axis is None:
            return _Digest(shape, slice_axes, proj, crc)
        earlier = self._digests.get(name) if name in self._prev else None
        before = self._prev.get(name)
        if before is None:
            raise EngineProtocolError(
                f"state array {name!r}: a digest from start {start} with no earlier state message of this "
                "request to build on (the first state message of a request is whole)"
            )
        old_shape, old_crc = before
        if (
            len(old_shape) != len(shape)
            or any(a != b for i, (a, b) in enumerate(zip(old_shape, shape, strict=True)) if i != axis)
            or start != old_shape[axis]
        ):
            raise EngineProtocolError(
                f"state array {name!r}: a digest of shape {list(shape)} from {start} along axis {axis} does not "
                f"extend the previous message's shape {list(old_shape)} (start must be its length along the axis)"
            )
        if int(spec["prefix_crc32"]) != old_crc:
            problems.append(
                f"state array {name!r} at processed={message['processed']}: the CRC-32 of its first {start} "
                f"rows is now {int(spec['prefix_crc32']):#010x}, but the whole array was {old_crc:#010x} when the "
                f"engine reported it in the previous state message: rows before {start} changed after it "
                "reported them (append-only KV; docs/contract.md), or a CRC is wrong"
            )
        if earlier is not None and earlier.slice_axes != slice_axes:
            raise EngineProtocolError(f"state array {name!r}: slice {slice_axes}, but {earlier.slice_axes} before")
        if earlier is None:  # the previous message sent its values: digest them (compared again, soundly)
            seed, n = self.digest
            values, _ = projections(self._base[name], seed=seed, n=n, slice_axes=slice_axes)
            held_rows, unchecked = values.astype(np.float32), 0
        else:
            held_rows = earlier.proj
            unchecked = start if earlier.checked else earlier.unchecked_from
        held = _Digest(shape, slice_axes, np.concatenate([held_rows, proj], axis=axis), crc)
        held.axis = axis
        held.unchecked_from = min(unchecked, start)
        self.rows_left_out += start
        return held

    def __repr__(self) -> str:
        return f"<WireTargetView processed={self.processed} arrays={sorted(self._arrays)}>"


# --------------------------------------------------------------------------- the engine

_LIVE: weakref.WeakSet[WireEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # pragma: no cover - runs at interpreter exit
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine.close()


#: how the state may travel (docs/protocol.md, ``state``); the default is the first the engine offers
#: of digest, delta, full
STATE_MODES = ("digest", "delta", "full")
#: signed projections per slice in a digest: each one that is missed lets a wrong slice through with
#: chance 1/2 for a two-element swap, so two per slice and many slices make a miss negligible
DIGEST_PROJECTIONS = 2

#: how often a failed engine is restarted in one run before every later request fails at once
DEFAULT_MAX_RESTARTS = 8
_HELLO_IDENTITY = ("vocab_size", "max_context", "k", "rollback", "capabilities", "model", "d_model", "feature_layers")


class WireEngine:
    """An engine behind ``specproof-engine/1`` (see the module docstring and docs/protocol.md).

    ``connect(limit)`` makes a transport (starts the process, or connects); it is called again
    by ``reset()`` after a fault — at most ``max_restarts`` times — so one crash costs one
    check its verdict, not the run. ``max_line_bytes`` bounds every line the engine sends
    (default: the handshake's, see docs/protocol.md "Limits"). ``load_target`` turns the handshake's
    ``model`` into the oracle (default: engine-level target specs only; ``specproof.plugins`` passes
    its own, which also knows the fixtures).
    """

    def __init__(
        self,
        connect: Callable[[int], _Transport],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        state: bool = True,
        full_state: bool = False,
        state_mode: str | None = None,
        max_line_bytes: int | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        load_target: Callable[[str], Target] | None = None,
    ) -> None:
        if not isinstance(full_state, bool):
            raise ValueError(f"full_state={full_state!r}: expected a bool")
        if state_mode not in (None, *STATE_MODES):
            raise ValueError(f"state_mode={state_mode!r}: expected one of {', '.join(map(repr, STATE_MODES))}")
        if full_state and state_mode not in (None, "full"):
            raise ValueError(f"full_state=True with state_mode={state_mode!r}: choose one")
        mode = "full" if full_state else state_mode or "digest"
        if max_line_bytes is not None and (isinstance(max_line_bytes, bool) or int(max_line_bytes) < 1024):
            raise ValueError(f"max_line_bytes={max_line_bytes!r}: expected an int >= 1024 (bytes)")
        if isinstance(max_restarts, bool) or int(max_restarts) < 0:
            raise ValueError(f"max_restarts={max_restarts!r}: expected an int >= 0")
        self._connect = connect
        #: keys the digest seeds (``_digest_seed``): secret from the engine, fixed for this client (or
        #: ``$SPECPROOF_WIRE_DIGEST_KEY``, to replay a digest failure's signs)
        self._salt = digest_key()
        #: turns the handshake's ``model`` spec into the oracle (``specproof.plugins.load_target`` knows fixtures)
        self._load_target = load_engine_target if load_target is None else load_target
        self.timeout = float(timeout)
        self._max_line_setting = None if max_line_bytes is None else int(max_line_bytes)
        self.max_restarts = int(max_restarts)
        self.restarts = 0
        #: every fault seen (the first is the one later errors name); one entry per restart
        self.faults: list[str] = []
        self._closed = False
        self._broken: str | None = None
        self._last = "(nothing yet)"
        self._next_id = 1
        #: what went over the wire (see ``wire_summary()``)
        self.traffic: dict[str, float] = dict.fromkeys(
            (
                "bytes_received",
                "bytes_sent",
                "messages_received",
                "generations",
                "rounds",
                "timed_rounds",
                "wall_us",
                "engine_us",
                "drafter_us",
            ),
            0,
        )
        _LIVE.add(self)
        self._transport = connect(HANDSHAKE_LINE_BYTES if max_line_bytes is None else int(max_line_bytes))
        self.spec = self._transport.describe
        self.label = self.spec
        hello = self._handshake()
        self.hello = hello
        self.vocab_size: int = hello["vocab_size"]
        self.max_context: int = hello["max_context"]
        self.k: int = hello["k"]
        self.rollback: str = hello["rollback"]
        self.capabilities: frozenset[str] = frozenset(hello["capabilities"])
        self.engine_name: str = hello["engine"]["name"]
        self.engine_version: str = str(hello["engine"].get("version", ""))
        self.atol: float = float(hello.get("atol", 0.0))
        self.tie_tolerance: float = float(hello.get("tie_tolerance", 0.0))
        self.model: str | None = hello.get("model")
        #: capability ``features``: the width of a feature row and the layers the engine can hand over
        #: (docs/protocol.md, Features); None without the capability
        self.d_model: int | None = hello["d_model"] if "features" in self.capabilities else None
        self.feature_layers: tuple[int, ...] | None = (
            tuple(int(x) for x in hello["feature_layers"]) if "features" in self.capabilities else None
        )
        #: the features the engine sent in the current request: [len(layers), rows, d_model] (None: none asked)
        self._feature_rows: npt.NDArray[np.float32] | None = None
        self._feature_layers_asked: tuple[int, ...] = ()
        self.name = f"{self.engine_name} {self.engine_version} via {self.spec}".replace("  ", " ")
        #: how errors name the engine: the handshake's name, then how it was reached
        self.label = f"{self.engine_name} ({self.spec})"
        #: send state dumps with every round (capability ``state``); turn off to time the engine
        self.send_state = state and "state" in self.capabilities
        #: ask for digests (capability ``state_digest``; the default): signed projections per slice
        #: instead of values, KV rows the client has seen left out (docs/protocol.md, ``state``)
        self.state_digest = self.send_state and mode == "digest" and "state_digest" in self.capabilities
        #: else ask for KV deltas (capability ``state_delta``) unless ``full_state``: rows the client holds
        #: are left out and checked by CRC-32 (docs/protocol.md, ``state``)
        self.state_delta = (
            self.send_state and not self.state_digest and mode != "full" and "state_delta" in self.capabilities
        )
        #: the engine's own time for the last generate (``final.elapsed_us``) and its prefill part
        self.last_elapsed_us: float | None = None
        self.last_prefill_us: float | None = None
        #: the draft the suite sent for each round of the last generate (round -> tokens)
        self.last_drafts_sent: dict[int, list[int]] = {}
        self.oracle: Target | None = None
        if self.model is not None:
            try:
                self.oracle = self._load_target(self.model)
            except Exception as exc:
                self._kill()
                raise EngineProtocolError(
                    f"engine {self.label}: its handshake names the model {self.model!r}, which is not a target "
                    f"specproof can load: {exc}"
                ) from exc
        #: the longest line accepted from the engine (bytes; docs/protocol.md, "Limits")
        self.max_line_bytes = self._max_line_setting or self._default_line_limit()
        self._transport.set_limit(self.max_line_bytes)
        #: why the suite cannot compare the state (None when it can)
        self.no_state_reason: str | None = None
        if "state" in self.capabilities:
            self.target = WireTargetView(self.vocab_size, self.max_context, self.name)
            self.target.digest_key = self._salt.hex()
        else:
            self.no_state_reason = (
                "the engine does not advertise the 'state' capability, so it sends no state to compare "
                "(docs/protocol.md, Capabilities)"
            )
        if "greedy" in self.capabilities:
            self.greedy = self._greedy
        #: capability ``sessions``: the engine keeps its caches between requests and says how many prompt
        #: tokens it served from them (``stats.prefix_reused``); ``engine.session`` holds it to both
        self.reuses_prefix: bool = "sessions" in self.capabilities
        if "suite_drafts" in self.capabilities:
            #: the suite's drafter (capability ``suite_drafts``); absent otherwise, so the suite
            #: judges the engine on its own drafts
            self.drafter: Any = None

    def _handshake(self) -> dict[str, Any]:
        try:
            hello = self._receive(("hello",), "the handshake")
            try:
                check_handshake_sizes(hello)
            except EngineProtocolError as exc:
                self._fault(str(exc), "the handshake")
        except BaseException:
            self._kill()
            raise
        return hello

    def _default_line_limit(self) -> int:
        """The largest legitimate line at the handshake's sizes (docs/protocol.md, "Limits")."""
        limit = self._state_line_limit()
        if self.feature_layers is not None and self.d_model is not None:
            limit = max(limit, feature_line_bytes(len(self.feature_layers), self.d_model, self.max_context))
        return limit

    def _state_line_limit(self) -> int:
        """The longest legitimate state line (``NO_STATE_LINE_BYTES`` without the capability)."""
        if "state" not in self.capabilities:
            return NO_STATE_LINE_BYTES
        oracle = self.oracle
        arrays = getattr(oracle, "state_arrays", None)
        if oracle is None or not callable(arrays) or not callable(getattr(oracle, "forward", None)):
            return STATE_LINE_BYTES
        try:
            oracle.reset()
            empty = sum(int(a.nbytes) for a in arrays().values())
            oracle.forward([0])
            one = sum(int(a.nbytes) for a in arrays().values())
            oracle.reset()
        except Exception:
            return STATE_LINE_BYTES
        return state_line_bytes(empty, max(0, one - empty), self.max_context)

    # ----------------------------------------------------------------- plumbing

    @property
    def stderr_tail(self) -> str:
        """The last lines the engine wrote to stderr (empty over TCP).

        What is already in the pipe is taken first (``settle_stderr``, at most 0.5 s): a reader
        thread not yet scheduled otherwise hides lines written long before (seen: 9 in 200 reads
        at load 7 missed the engine's first line)."""
        self._transport.settle_stderr()
        return self._transport.stderr_tail

    def describe(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<WireEngine {self.spec} k={getattr(self, 'k', '?')} rollback={getattr(self, 'rollback', '?')}>"

    def _fault(self, what: str, request: str) -> NoReturn:
        """Raise an engine fault: the engine is restarted by the next request; the first cause is kept."""
        if self._broken is None:
            self._broken = f"{request}: {what}. Last message received: {_clip(self._last, 200)}"
            self.faults.append(self._broken)
        tail = self.stderr_tail
        text = f"engine {self.label}, {request}: {what}. Last message received: {_clip(self._last)}" + (
            f"\nengine stderr (tail):\n{tail}" if tail else "\n(the engine wrote nothing to stderr)"
        )
        self._raise(EngineProtocolError(text, stderr_tail=tail))

    @staticmethod
    def _raise(error: EngineProtocolError) -> NoReturn:
        """Every engine fault is raised here, without the handler's exception as context: a search that
        replays an example sees the same failure whatever line noticed it (no ``Flaky``)."""
        try:
            raise error
        finally:
            error.__context__ = None

    def _send(self, message: dict[str, Any], request: str) -> None:
        if self._closed:
            raise EngineProtocolError(f"engine {self.label}: {request}: the engine was closed")
        if self._broken is not None:
            self._restart(request)
        line = json.dumps(message, separators=(",", ":"))
        self.traffic["bytes_sent"] += len(line) + 1
        try:
            self._transport.send(line)
        except EngineProtocolError as exc:
            self._fault(str(exc), request)

    def _receive(self, expect: tuple[str, ...], request: str) -> dict[str, Any]:
        want = " or ".join(expect)
        try:
            line = self._transport.recv(self.timeout)
        except queue.Empty:
            self._fault(f"timed out after {self.timeout:g} s: no message (expected {want})", request)
        except LineTooLong as exc:
            self._fault(
                f"{message_kind(exc.head)} longer than the limit of {exc.limit} bytes ({exc.seen} bytes seen "
                "without a newline; reading stopped). Set max_line_bytes= or $SPECPROOF_WIRE_MAX_LINE for a "
                "larger limit (docs/protocol.md, Limits)",
                request,
            )
        if line is None:
            self._fault(f"{self._transport.exit_note()} before sending {want}", request)
        self._last = line
        self.traffic["bytes_received"] += len(line) + 1
        self.traffic["messages_received"] += 1
        try:
            message = parse_line(line)
        except ValueError as exc:
            self._fault(str(exc), request)
        try:
            return validate_message(message, expect=expect)
        except EngineProtocolError as exc:
            self._fault(str(exc), request)

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    @staticmethod
    def _request_text(kind: str, rid: int, prompt: Sequence[int] | None = None, n: int | None = None) -> str:
        if prompt is None:
            return f"request {kind} #{rid}"
        head = list(prompt[:8])
        more = "..." if len(prompt) > 8 else ""
        return f"request {kind} #{rid} (prompt of {len(prompt)} tokens {head}{more}, max_new_tokens={n})"

    def _check_id(self, message: dict[str, Any], rid: int, request: str) -> None:
        if message.get("id") != rid and not (message["type"] == "error" and message.get("id") is None):
            self._fault(f"the message answers request #{message.get('id')}, not #{rid}", request)

    def wire_summary(self) -> dict[str, object]:
        """Traffic and protocol overhead so far (the certificate shows it; docs/protocol.md).

        ``overhead_us_per_round``: the client's wall time of the generations minus the engine's
        own ``elapsed_us`` and the suite's drafter time, per round (None without ``elapsed_us``).
        """
        t = self.traffic
        rounds = int(t["timed_rounds"])
        overhead = (t["wall_us"] - t["engine_us"] - t["drafter_us"]) / rounds if rounds else None
        return {
            "bytes_received": int(t["bytes_received"]),
            "bytes_sent": int(t["bytes_sent"]),
            "messages_received": int(t["messages_received"]),
            "generations": int(t["generations"]),
            "rounds": int(t["rounds"]),
            "overhead_us_per_round": None if overhead is None else round(overhead, 1),
            "state": self.state_kind(),
            "restarts": self.restarts,
            "faults": len(self.faults),
        }

    def _digest_seed(self, prompt: list[int], max_new_tokens: int, eos_token_id: int | None) -> int:
        """The signs' seed for a request: this client's secret salt and the request, hashed (below 2**53).

        The engine cannot predict it, and the same request gets the same signs in this client, so a
        search that replays a failing example sees the same verdict (never a flaky one).
        """
        text = json.dumps([prompt, int(max_new_tokens), eos_token_id], separators=(",", ":")).encode()
        digest = hashlib.blake2b(text, key=self._salt, digest_size=8).digest()
        return int.from_bytes(digest, "little") & ((1 << 53) - 1)

    def state_kind(self) -> str:
        """How the state travels: ``digests``, ``deltas``, ``full arrays`` or ``none`` (the ``wire:`` line)."""
        if not self.send_state:
            return "none"
        return "digests" if self.state_digest else "deltas" if self.state_delta else "full arrays"

    # ----------------------------------------------------------------- requests

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        """One speculative generation; drafts from ``self.drafter`` when it is set."""
        tokens = [int(t) for t in prompt]
        rid = self._new_id()
        request = self._request_text("generate", rid, tokens, max_new_tokens)
        drafter = getattr(self, "drafter", None)
        layers: tuple[int, ...] = ()
        if drafter is not None:
            if "suite_drafts" not in self.capabilities:
                raise EngineRequestError(
                    f"engine {self.label}: a drafter was set, but the engine does not take drafts from the suite "
                    f"(its capabilities: {sorted(self.capabilities)})"
                )
            layers = self._features_to_ask(drafter)
            reset = getattr(drafter, "reset", None)
            if callable(reset):
                reset()
        # the wall clock starts before the request goes out: the engine's own clock may start before
        # this process runs again (a loaded machine), and sending is the protocol's cost anyway
        started = time.perf_counter()
        digest = (
            (self._digest_seed(tokens, max_new_tokens, eos_token_id), DIGEST_PROJECTIONS) if self.state_digest else None
        )
        self._send(
            {
                "type": "generate",
                "id": rid,
                "prompt": tokens,
                "max_new_tokens": int(max_new_tokens),
                "eos_token_id": None if eos_token_id is None else int(eos_token_id),
                "drafts": "engine" if drafter is None else "suite",
                "state": self.send_state,
                **({"state_delta": True} if self.state_delta else {}),
                **({"state_digest": {"seed": digest[0], "projections": digest[1]}} if digest else {}),
                **({"feature_layers": list(layers)} if layers else {}),
            },
            request,
        )
        self._feature_layers_asked = layers
        self._feature_rows = np.zeros((len(layers), 0, self.d_model or 0), np.float32) if layers else None
        if self.send_state:
            self.target.begin_request(digest=digest)
        ctx = list(tokens)
        steps: list[Step] = []
        states = 0
        drafter_us = 0.0  # the suite's drafter: neither the engine's time nor the protocol's
        self.last_drafts_sent = {}
        # every round emits a token: at most a state, a propose and a round per round, a state at the end
        budget = 3 * (max(0, int(max_new_tokens)) + 1) + 2
        while True:
            budget -= 1
            if budget < 0:
                self._fault(
                    f"more messages than {max_new_tokens} new tokens allow (3 per round and a final state)", request
                )
            msg = self._receive(("round", "state", "propose", "final", "error"), request)
            self._check_id(msg, rid, request)
            kind = msg["type"]
            if kind == "round":
                if msg["round"] != len(steps):
                    self._fault(f"round record {msg['round']} arrived after {len(steps)} rounds", request)
                steps.append(
                    Step(
                        base=msg["base"],
                        draft=msg["draft"],
                        argmax=msg["argmax"],
                        accepted=msg["accepted"],
                        processed=msg["processed"],
                    )
                )
                ctx.extend(msg["accepted"])
            elif kind == "state":
                if not self.send_state:
                    self._fault("a state message, but the request asked for none", request)
                states += 1
                try:
                    self.target.update(msg, delta=self.state_delta)
                except EngineProtocolError as exc:
                    self._fault(str(exc), request)
            elif kind == "propose":
                drafter_us += self._answer_propose(msg, drafter, ctx, rid, request)
            elif kind == "error":
                raise EngineRequestError(
                    f"engine {self.label}, {request}: the engine answered with an error: {msg['message']}"
                )
            else:
                if self.send_state and states != len(steps) + 1:
                    self._fault(
                        f"the request asked for the state (capability 'state': one state message before every "
                        f"round and one after the last), but the engine sent {states} for {len(steps)} rounds "
                        "(docs/protocol.md, state)",
                        request,
                    )
                self.last_elapsed_us = msg.get("elapsed_us")
                self.last_prefill_us = msg.get("prefill_us")
                self.last_wall_us = (time.perf_counter() - started) * 1e6
                self.traffic["generations"] += 1
                self.traffic["rounds"] += len(steps)
                if self.last_elapsed_us is not None and steps:
                    self.traffic["timed_rounds"] += len(steps)
                    self.traffic["wall_us"] += self.last_wall_us
                    self.traffic["engine_us"] += float(self.last_elapsed_us)
                    self.traffic["drafter_us"] += drafter_us
                stats = msg.get("stats")
                return Generation(
                    tokens=msg["tokens"],
                    stop_reason=msg["stop_reason"],
                    steps=tuple(steps),
                    stats=None
                    if stats is None
                    else Stats(
                        rounds=stats["rounds"],
                        emitted=stats["emitted"],
                        prefill_forwards=stats["prefill_forwards"],
                        verify_forwards=stats["verify_forwards"],
                        replay_forwards=stats["replay_forwards"],
                        drafted=stats["drafted"],
                        accepted=stats["accepted"],
                        position_attempts=tuple(stats["position_attempts"]),
                        position_accepts=tuple(stats["position_accepts"]),
                        prefix_reused=stats.get("prefix_reused"),
                    ),
                )

    def _features_to_ask(self, drafter: Any) -> tuple[int, ...]:
        """The layers to ask the engine for: the drafter's ``feature_layers`` when the engine has the
        capability ``features`` (else none: a feature drafter then computes its features itself)."""
        raw = getattr(drafter, "feature_layers", None)
        if raw is None or self.feature_layers is None:
            return ()
        layers = tuple(int(x) for x in raw)
        for layer in layers:
            if layer not in self.feature_layers:
                raise EngineRequestError(
                    f"engine {self.label}: the drafter reads the features of layer {layer}, which the engine does "
                    f"not report (its handshake's feature_layers: {list(self.feature_layers)}); nothing was sent"
                )
        return layers

    def _take_features(self, msg: dict[str, Any], request: str) -> dict[int, npt.NDArray[np.float32]] | None:
        """The features to hand the drafter: the rows held after this propose's ``features`` (None: none asked)."""
        held = self._feature_rows
        sent = msg.get("features")
        if held is None:
            if sent is not None:
                self._fault("a propose with features, but the request asked for none (no feature_layers)", request)
            return None
        if sent is not None:
            layers, d_model = len(self._feature_layers_asked), held.shape[2]
            try:
                start, rows = check_feature_shape(
                    sent, held=held.shape[1], layers=layers, d_model=d_model, max_context=self.max_context
                )
            except EngineProtocolError as exc:
                self._fault(str(exc), request)
            try:
                _, new = _float32(sent["data"], (layers, rows, d_model), "propose features.data")
            except EngineProtocolError as exc:
                self._fault(str(exc), request)
            held = np.concatenate([held[:, :start], new], axis=1)
            held.flags.writeable = False
            self._feature_rows = held
        # exactly the rows the engine sent, however many: engine.features judges the count too
        return {layer: held[i] for i, layer in enumerate(self._feature_layers_asked)}

    def _answer_propose(self, msg: dict[str, Any], drafter: Any, ctx: list[int], rid: int, request: str) -> float:
        """Send the drafter's answer; returns the microseconds the drafter took.

        Only ``propose`` itself is timed: once the draft is sent the engine computes again, so a clock
        read after the send (late when this process is descheduled) would subtract engine time twice
        from the overhead estimate (measured: negative overheads under load before).
        """
        if drafter is None:
            self._fault("the engine asked for a draft (propose), but the request said drafts=engine", request)
        if msg["context_length"] != len(ctx):
            self._fault(
                f"propose says the context has {msg['context_length']} tokens, but the prompt and the round "
                f"records make {len(ctx)}",
                request,
            )
        features = self._take_features(msg, request)
        started = time.perf_counter()
        try:
            if features is None:
                draft = [int(t) for t in drafter.propose(tuple(ctx), msg["k"])]
            else:
                draft = [int(t) for t in drafter.propose(tuple(ctx), msg["k"], features=features)]
        except BaseException:
            # the engine waits for a draft: abandon the request (it answers with an error) and resync
            with contextlib.suppress(EngineProtocolError):
                self._send({"type": "reset", "id": self._new_id()}, request)
                while True:
                    answer = self._receive(("round", "state", "error", "ok", "final"), request)
                    if answer["type"] == "error" and answer.get("id") in (rid, None):
                        break
            raise
        spent_us = (time.perf_counter() - started) * 1e6
        self._send({"type": "draft", "id": rid, "round": msg["round"], "tokens": draft}, request)
        self.last_drafts_sent[int(msg["round"])] = draft
        return spent_us

    def _greedy(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> list[int]:
        """Plain greedy decoding by the engine (capability ``greedy``)."""
        tokens = [int(t) for t in prompt]
        rid = self._new_id()
        request = self._request_text("greedy", rid, tokens, max_new_tokens)
        message: dict[str, Any] = {"type": "greedy", "id": rid, "prompt": tokens, "max_new_tokens": int(max_new_tokens)}
        if eos_token_id is not None:
            message["eos_token_id"] = int(eos_token_id)
        self._send(message, request)
        msg = self._receive(("final", "error"), request)
        self._check_id(msg, rid, request)
        if msg["type"] == "error":
            raise EngineRequestError(
                f"engine {self.label}, {request}: the engine answered with an error: {msg['message']}"
            )
        return [int(t) for t in msg["tokens"]]

    def reset(self) -> None:
        """Start a new session: the engine forgets its caches.

        After a fault (``EngineProtocolError``) every request first restarts the engine — a
        new process, or a new connection — at most ``max_restarts`` times in all.
        """
        rid = self._new_id()
        request = self._request_text("reset", rid)
        self._send({"type": "reset", "id": rid}, request)
        msg = self._receive(("ok", "error"), request)
        self._check_id(msg, rid, request)
        if msg["type"] == "error":
            raise EngineRequestError(f"engine {self.label}, {request}: {msg['message']}")
        view = getattr(self, "target", None)
        if isinstance(view, WireTargetView):
            view.clear()

    def _restart(self, why: str) -> None:
        if self.restarts >= self.max_restarts:
            self._raise(
                EngineProtocolError(
                    f"engine {self.label}, {why}: not sent: the engine failed {len(self.faults)} times and was "
                    f"restarted {self.restarts} times (max_restarts={self.max_restarts}); the first failure: "
                    f"{self.faults[0]}",
                    stderr_tail=self.stderr_tail,
                )
            )
        request = f"{why}: restart {self.restarts + 1} of at most {self.max_restarts} after a fault"
        with contextlib.suppress(Exception):
            self._transport.close(1.0)
        self.restarts += 1
        problem = None
        try:
            self._transport = self._connect(self.max_line_bytes)
        except EngineProtocolError as exc:
            problem = str(exc)
        if problem is not None:
            self._fault(f"cannot restart it: {problem}; the first failure: {self.faults[0]}", request)
        self._broken, self._last = None, "(nothing yet)"
        hello = self._handshake_again(request)
        changed = [f for f in _HELLO_IDENTITY if hello.get(f) != self.hello.get(f)]
        if changed:
            self._fault(
                "the restarted engine's handshake differs from the first in "
                + ", ".join(f"{f} ({self.hello.get(f)!r} -> {hello.get(f)!r})" for f in changed),
                request,
            )
        view = getattr(self, "target", None)
        if isinstance(view, WireTargetView):
            view.clear()

    def _handshake_again(self, request: str) -> dict[str, Any]:
        self._closed = False
        _LIVE.add(self)
        return self._receive(("hello",), request)

    #: whether ``close()`` asks the engine to exit (a process we started) or only disconnects
    shutdown_on_close = True

    def close(self, *, timeout: float = 5.0) -> None:
        """End the conversation; idempotent.

        ``ExecEngine``: send ``shutdown``, wait ``timeout`` seconds, then kill the process.
        ``TcpEngine``: only disconnect (the engine goes on listening for the next session);
        ``shutdown()`` stops it.
        """
        if self._closed:
            return
        if self.shutdown_on_close:
            self.shutdown(timeout=timeout)
        self._kill(timeout)

    def shutdown(self, *, timeout: float = 5.0) -> None:
        """Send ``shutdown`` and wait up to ``timeout`` seconds for its ``ok``; then close."""
        if self._broken is None and not self._closed:
            with contextlib.suppress(Exception):
                rid = self._new_id()
                self._transport.send(json.dumps({"type": "shutdown", "id": rid}))
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    line = self._transport.recv(max(0.01, deadline - time.monotonic()))
                    if line is None or '"ok"' in line:
                        break
        self._kill(timeout)

    def _kill(self, timeout: float = 0.0) -> None:
        self._closed = True
        _LIVE.discard(self)
        with contextlib.suppress(Exception):
            self._transport.close(timeout)

    def __enter__(self) -> WireEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not getattr(self, "_closed", True):
                self._kill(1.0)


def _split_command(command: str | Sequence[str]) -> list[str]:
    if isinstance(command, str):
        argv = shlex.split(command)
        if len(argv) == 1 and " " in argv[0]:  # exec:'CMD ARGS' with the quotes kept
            argv = shlex.split(argv[0])
    else:
        argv = [str(a) for a in command]
    if not argv:
        raise EngineProtocolError("exec: engine command is empty")
    return argv


class ExecEngine(WireEngine):
    """Start ``command`` (a string, split with ``shlex``, or an argv list) and speak the protocol on its stdio."""

    def __init__(
        self,
        command: str | Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        state: bool = True,
        full_state: bool = False,
        state_mode: str | None = None,
        max_line_bytes: int | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        load_target: Callable[[str], Target] | None = None,
    ) -> None:
        self.argv = _split_command(command)
        where = None if cwd is None else os.fspath(cwd)
        argv = self.argv
        if DIGEST_KEY_ENV in (os.environ if env is None else env):  # the engine must not know the key
            env = {k: v for k, v in (os.environ if env is None else env).items() if k != DIGEST_KEY_ENV}
        super().__init__(
            lambda limit: _ProcessTransport(argv, cwd=where, env=env, limit=limit),
            timeout=timeout,
            state=state,
            full_state=full_state,
            state_mode=state_mode,
            max_line_bytes=max_line_bytes,
            max_restarts=max_restarts,
            load_target=load_target,
        )

    @property
    def returncode(self) -> int | None:
        transport = self._transport
        assert isinstance(transport, _ProcessTransport)
        return transport.proc.poll()


class TcpEngine(WireEngine):
    """Connect to an engine listening on ``host:port`` (a device on the network, or loopback in tests).

    ``close()`` disconnects and leaves the engine running; ``shutdown()`` stops it. A restart
    after a fault is a new connection.
    """

    shutdown_on_close = False

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        state: bool = True,
        full_state: bool = False,
        state_mode: str | None = None,
        max_line_bytes: int | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        load_target: Callable[[str], Target] | None = None,
    ) -> None:
        where = int(port)
        super().__init__(
            lambda limit: _SocketTransport(host, where, timeout=timeout, limit=limit),
            timeout=timeout,
            state=state,
            full_state=full_state,
            state_mode=state_mode,
            max_line_bytes=max_line_bytes,
            max_restarts=max_restarts,
            load_target=load_target,
        )


def digest_key() -> bytes:
    """``$SPECPROOF_WIRE_DIGEST_KEY`` (32 hex digits, as a digest failure prints it), else 16 fresh random bytes."""
    raw = os.environ.get(DIGEST_KEY_ENV, "")
    if not raw:
        return secrets.token_bytes(16)
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) != 16:
        raise EngineProtocolError(
            f"${DIGEST_KEY_ENV}={raw!r}: expected 32 hex digits (the key a digest failure names), or unset"
        )
    return key


def _env_number(name: str, default: float | None, *, minimum: float) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EngineProtocolError(f"${name}={raw!r}: expected a number") from None
    if not value >= minimum:
        raise EngineProtocolError(f"${name}={raw!r}: expected a number >= {minimum:g}")
    return value


def engine_from_spec(
    spec: str, *, timeout: float | None = None, load_target: Callable[[str], Target] | None = None
) -> Callable[[], WireEngine]:
    """A factory for ``exec:CMD ARGS`` or ``tcp:HOST:PORT`` (``load_target``: see ``WireEngine``).

    The timeout per message is ``$SPECPROOF_WIRE_TIMEOUT`` (default 60 s); the line limit
    ``$SPECPROOF_WIRE_MAX_LINE`` bytes (default: worked out from the handshake);
    ``$SPECPROOF_WIRE_STATE`` says how the state travels: ``digest`` (the default: digests where the
    engine offers ``state_digest``, else deltas, else whole arrays), ``delta`` (KV deltas where the
    engine offers ``state_delta``) or ``full`` (whole arrays every time).
    """
    if timeout is None:
        timeout = _env_number("SPECPROOF_WIRE_TIMEOUT", DEFAULT_TIMEOUT, minimum=0.01)
    assert timeout is not None
    limit = _env_number("SPECPROOF_WIRE_MAX_LINE", None, minimum=1024)
    max_line = None if limit is None else int(limit)
    mode = os.environ.get("SPECPROOF_WIRE_STATE", "") or "digest"
    if mode not in STATE_MODES:
        raise EngineProtocolError(f"$SPECPROOF_WIRE_STATE={mode!r}: expected 'digest', 'delta' or 'full'")
    digest_key()  # a malformed key is refused here, before any engine starts
    kind, _, rest = spec.partition(":")
    if kind == "exec":
        argv = _split_command(rest)
        return lambda: ExecEngine(
            argv, timeout=timeout, state_mode=mode, max_line_bytes=max_line, load_target=load_target
        )
    if kind == "tcp":
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise EngineProtocolError(f"engine spec {spec!r}: expected tcp:HOST:PORT, for example tcp:127.0.0.1:7070")
        return lambda: TcpEngine(
            host.strip("[]"),
            int(port),
            timeout=timeout,
            state_mode=mode,
            max_line_bytes=max_line,
            load_target=load_target,
        )
    raise EngineProtocolError(f"engine spec {spec!r}: expected exec:CMD ARGS or tcp:HOST:PORT")
