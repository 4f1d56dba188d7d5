"""One conversation with an engine: the handshake, every message each way (each one checked against its
schema and the line limit), request ids, faults (one report naming the engine, the request, the last
message and the stderr tail) and restarts after a fault; closing it.
"""

from __future__ import annotations

import contextlib
import json
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from specproof.wire._errors import EngineProtocolError
from specproof.wire._limits import LineTooLong, check_handshake_sizes, message_kind, parse_line
from specproof.wire._schemas import validate_message
from specproof.wire._transport import Transport

__all__ = ["HELLO_IDENTITY", "Channel", "clip", "request_text"]

_SHOW = 300  # characters of a message quoted in an error
#: the handshake fields a restarted engine must repeat
HELLO_IDENTITY = (
    "vocab_size",
    "max_context",
    "k",
    "rollback",
    "capabilities",
    "model",
    "d_model",
    "feature_layers",
    "sampling_schemes",
    "batch",
)
#: what went over the wire (``WireEngine.traffic``; ``wire_summary()``)
_TRAFFIC = (
    "bytes_received",
    "bytes_sent",
    "messages_received",
    "generations",
    "rounds",
    "timed_rounds",
    "wall_us",
    "engine_us",
    "drafter_us",
)


def clip(text: str, n: int = _SHOW) -> str:
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


def request_text(kind: str, rid: int, prompt: Sequence[int] | None = None, n: int | None = None) -> str:
    """How errors name a request: ``request generate #3 (prompt of 12 tokens [...], max_new_tokens=8)``."""
    if prompt is None:
        return f"request {kind} #{rid}"
    head = list(prompt[:8])
    more = "..." if len(prompt) > 8 else ""
    return f"request {kind} #{rid} (prompt of {len(prompt)} tokens {head}{more}, max_new_tokens={n})"


class Channel:
    """The messages to and from one engine over the transport ``connect(limit)`` makes.

    A fault (``fault``) marks the channel broken; the next ``send`` first restarts the engine
    (``connect`` again, the same handshake required), at most ``max_restarts`` times in all.
    ``on_restart`` is called after each restart (the engine forgets the state it held).
    """

    def __init__(self, connect: Callable[[int], Transport], *, timeout: float, limit: int, max_restarts: int) -> None:
        self._connect = connect
        self.timeout = float(timeout)
        self.max_restarts = max_restarts
        self.restarts = 0
        #: every fault seen (the first is the one later errors name); one entry per restart
        self.faults: list[str] = []
        self.closed = False
        self._broken: str | None = None
        self._last = "(nothing yet)"
        self._next_id = 1
        self.traffic: dict[str, float] = dict.fromkeys(_TRAFFIC, 0)
        self.on_restart: Callable[[], None] | None = None
        #: the first handshake (a restarted engine must repeat its ``HELLO_IDENTITY`` fields)
        self.hello: dict[str, Any] = {}
        self.limit = limit
        self.transport = connect(limit)
        self.spec = self.transport.describe
        #: how errors name the engine: how it was reached, then (after the handshake) its name too
        self.label = self.spec

    def handshake(self) -> dict[str, Any]:
        """The engine's ``hello`` (its sizes checked); the channel is closed when it is wrong."""
        try:
            hello = self.receive(("hello",), "the handshake")
            try:
                check_handshake_sizes(hello)
            except EngineProtocolError as exc:
                self.fault(str(exc), "the handshake")
        except BaseException:
            self.kill()
            raise
        self.hello = hello
        return hello

    def set_limit(self, limit: int) -> None:
        """The longest line accepted from now on (bytes)."""
        self.limit = limit
        self.transport.set_limit(limit)

    @property
    def stderr_tail(self) -> str:
        self.transport.settle_stderr()
        return self.transport.stderr_tail

    def summary(self, *, state: str) -> dict[str, object]:
        """Traffic, restarts and faults so far (``WireEngine.wire_summary()``, the report's engine entry ``wire``).

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
            "state": state,
            "restarts": self.restarts,
            "faults": len(self.faults),
        }

    # ----------------------------------------------------------------- faults

    def fault(self, what: str, request: str) -> NoReturn:
        """Raise an engine fault: the engine is restarted by the next request; the first cause is kept."""
        if self._broken is None:
            self._broken = f"{request}: {what}. Last message received: {clip(self._last, 200)}"
            self.faults.append(self._broken)
        tail = self.stderr_tail
        text = f"engine {self.label}, {request}: {what}. Last message received: {clip(self._last)}" + (
            f"\nengine stderr (tail):\n{tail}" if tail else "\n(the engine wrote nothing to stderr)"
        )
        self.raise_error(EngineProtocolError(text, stderr_tail=tail))

    @staticmethod
    def raise_error(error: EngineProtocolError) -> NoReturn:
        """Every engine fault is raised here, without the handler's exception as context: a search that
        replays an example sees the same failure whatever line noticed it (no ``Flaky``)."""
        try:
            raise error
        finally:
            error.__context__ = None

    def restart(self, why: str) -> None:
        if self.restarts >= self.max_restarts:
            self.raise_error(
                EngineProtocolError(
                    f"engine {self.label}, {why}: not sent: the engine failed {len(self.faults)} times and was "
                    f"restarted {self.restarts} times (max_restarts={self.max_restarts}); the first failure: "
                    f"{self.faults[0]}",
                    stderr_tail=self.stderr_tail,
                )
            )
        request = f"{why}: restart {self.restarts + 1} of at most {self.max_restarts} after a fault"
        with contextlib.suppress(Exception):
            self.transport.close(1.0)
        self.restarts += 1
        problem = None
        try:
            self.transport = self._connect(self.limit)
        except EngineProtocolError as exc:
            problem = str(exc)
        if problem is not None:
            self.fault(f"cannot restart it: {problem}; the first failure: {self.faults[0]}", request)
        self._broken, self._last = None, "(nothing yet)"
        hello = self.receive(("hello",), request)
        changed = [f for f in HELLO_IDENTITY if hello.get(f) != self.hello.get(f)]
        if changed:
            self.fault(
                "the restarted engine's handshake differs from the first in "
                + ", ".join(f"{f} ({self.hello.get(f)!r} -> {hello.get(f)!r})" for f in changed),
                request,
            )
        if self.on_restart is not None:
            self.on_restart()

    # ----------------------------------------------------------------- messages

    def send(self, message: dict[str, Any], request: str) -> None:
        if self.closed:
            raise EngineProtocolError(f"engine {self.label}: {request}: the engine was closed")
        if self._broken is not None:
            self.restart(request)
        line = json.dumps(message, separators=(",", ":"))
        self.traffic["bytes_sent"] += len(line) + 1
        try:
            self.transport.send(line)
        except EngineProtocolError as exc:
            self.fault(str(exc), request)

    def receive(self, expect: tuple[str, ...], request: str) -> dict[str, Any]:
        """The next message, which must be one of the types ``expect`` and valid; else a fault."""
        want = " or ".join(expect)
        try:
            line = self.transport.recv(self.timeout)
        except queue.Empty:
            self.fault(f"timed out after {self.timeout:g} s: no message (expected {want})", request)
        except LineTooLong as exc:
            self.fault(
                f"{message_kind(exc.head)} longer than the limit of {exc.limit} bytes ({exc.seen} bytes seen "
                "without a newline; reading stopped). Set max_line_bytes= or $SPECPROOF_WIRE_MAX_LINE for a "
                "larger limit (docs/protocol.md, Limits)",
                request,
            )
        if line is None:
            self.fault(f"{self.transport.exit_note()} before sending {want}", request)
        self._last = line
        self.traffic["bytes_received"] += len(line) + 1
        self.traffic["messages_received"] += 1
        try:
            message = parse_line(line)
        except ValueError as exc:
            self.fault(str(exc), request)
        try:
            return validate_message(message, expect=expect)
        except EngineProtocolError as exc:
            self.fault(str(exc), request)

    def new_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    def check_id(self, message: dict[str, Any], rid: int, request: str) -> None:
        if message.get("id") != rid and not (message["type"] == "error" and message.get("id") is None):
            self.fault(f"the message answers request #{message.get('id')}, not #{rid}", request)

    # ----------------------------------------------------------------- closing

    def shutdown(self, timeout: float) -> None:
        """Send ``shutdown`` and wait up to ``timeout`` seconds for its ``ok``; then close."""
        if self._broken is None and not self.closed:
            with contextlib.suppress(Exception):
                rid = self.new_id()
                self.transport.send(json.dumps({"type": "shutdown", "id": rid}))
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    line = self.transport.recv(max(0.01, deadline - time.monotonic()))
                    if line is None or '"ok"' in line:
                        break
        self.kill(timeout)

    def kill(self, timeout: float = 0.0) -> None:
        """Close the transport (a process is killed after ``timeout`` seconds); idempotent."""
        self.closed = True
        with contextlib.suppress(Exception):
            self.transport.close(timeout)
