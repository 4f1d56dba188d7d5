"""The client side of ``specproof-engine/1``: an external engine process as a specproof engine.

``ExecEngine("CMD ARGS")`` starts the engine and talks JSON Lines over its stdin/stdout;
``TcpEngine(host, port)`` connects to one already listening. Both are ``WireEngine`` s,
which implement the engine contract the suite consumes: ``generate`` (white-box: every
round's ``Step`` and the ``Stats``), ``greedy`` (capability ``greedy``), the settable
``drafter`` (capability ``suite_drafts``: the engine asks for every draft with ``propose``),
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
import json
import os
import queue
import shlex
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from specproof.engine import Generation, Stats, Step, Target, load_target
from specproof.wire._errors import EngineProtocolError, EngineRequestError
from specproof.wire._schemas import validate_message

__all__ = ["DEFAULT_TIMEOUT", "ExecEngine", "TcpEngine", "WireEngine", "WireTargetView", "engine_from_spec"]

DEFAULT_TIMEOUT = 60.0
_EOF = object()
_SHOW = 300  # characters of a message quoted in an error


def _clip(text: str, n: int = _SHOW) -> str:
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


# --------------------------------------------------------------------------- transports


class _LineReader:
    """A daemon thread that reads lines from ``stream`` into a queue (``_EOF`` at the end)."""

    def __init__(self, stream: IO[bytes], name: str) -> None:
        self.queue: queue.Queue[object] = queue.Queue()
        self._stream = stream
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for raw in iter(self._stream.readline, b""):
                self.queue.put(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        except (OSError, ValueError):
            pass
        finally:
            self.queue.put(_EOF)

    def get(self, timeout: float) -> str | None:
        """The next line; None at end of stream; raises ``queue.Empty`` after ``timeout`` seconds."""
        item = self.queue.get(timeout=timeout)
        if item is _EOF:
            self.queue.put(_EOF)  # every later read sees the end too
            return None
        assert isinstance(item, str)
        return item


class _Transport:
    describe = "engine"

    def send(self, line: str) -> None:
        raise NotImplementedError

    def recv(self, timeout: float) -> str | None:
        raise NotImplementedError

    def exit_note(self) -> str:
        return "the engine closed the connection"

    @property
    def stderr_tail(self) -> str:
        return ""

    def close(self, timeout: float) -> None:
        raise NotImplementedError


class _ProcessTransport(_Transport):
    def __init__(self, argv: list[str], *, cwd: str | None, env: dict[str, str] | None) -> None:
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
                bufsize=-1,  # buffered: readline on an unbuffered pipe reads one byte per call
            )
        except OSError as exc:
            raise EngineProtocolError(f"engine {self.describe}: cannot start it: {exc}") from exc
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._lines = _LineReader(self.proc.stdout, "specproof-wire-stdout")
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, name="specproof-wire-stderr", daemon=True)
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            for raw in iter(self.proc.stderr.readline, b""):
                self._stderr.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        except (OSError, ValueError):
            pass

    @property
    def stderr_tail(self) -> str:
        return "\n".join(self._stderr)[-4000:]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode("utf-8") + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise EngineProtocolError(f"cannot write to the engine: {exc}; {self.exit_note()}") from None

    def recv(self, timeout: float) -> str | None:
        return self._lines.get(timeout)

    def exit_note(self) -> str:
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "the engine closed its stdout but is still running"
        self._stderr_thread.join(timeout=1.0)
        return f"the engine exited with status {code}"

    def close(self, timeout: float) -> None:
        proc = self.proc
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
    def __init__(self, host: str, port: int, *, timeout: float) -> None:
        self.describe = f"tcp:{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise EngineProtocolError(f"engine {self.describe}: cannot connect: {exc}") from exc
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self.sock.makefile("rb")
        self._lines = _LineReader(self._file, "specproof-wire-tcp")

    def send(self, line: str) -> None:
        try:
            self.sock.sendall(line.encode("utf-8") + b"\n")
        except OSError as exc:
            raise EngineProtocolError(f"cannot write to the engine: {exc}") from None

    def recv(self, timeout: float) -> str | None:
        return self._lines.get(timeout)

    def close(self, timeout: float) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            self.sock.close()


# --------------------------------------------------------------------------- the live view


class WireTargetView:
    """The state the engine last reported: ``processed`` and ``state_arrays()`` (read-only view)."""

    def __init__(self, vocab_size: int, max_context: int, name: str) -> None:
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.name = f"{name} (live state over the wire)"
        self.processed = 0
        self._arrays: dict[str, npt.NDArray[np.float32]] = {}
        self.updates = 0

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        return {name: array.copy() for name, array in self._arrays.items()}

    def clear(self) -> None:
        self.processed = 0
        self._arrays = {}

    def update(self, message: dict[str, Any]) -> None:
        arrays: dict[str, npt.NDArray[np.float32]] = {}
        for name, spec in message["arrays"].items():
            try:
                raw = base64.b64decode(spec["data"], validate=True)
            except ValueError as exc:
                raise EngineProtocolError(f"state array {name!r}: data is not base64 ({exc})") from None
            shape = tuple(int(n) for n in spec["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            if len(raw) != 4 * count:
                raise EngineProtocolError(
                    f"state array {name!r}: {len(raw)} bytes of data for shape {list(shape)} ({4 * count} expected)"
                )
            arrays[name] = np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape)
        self._arrays = arrays
        self.processed = int(message["processed"])
        self.updates += 1

    def __repr__(self) -> str:
        return f"<WireTargetView processed={self.processed} arrays={sorted(self._arrays)}>"


# --------------------------------------------------------------------------- the engine

_LIVE: weakref.WeakSet[WireEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # pragma: no cover - runs at interpreter exit
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine.close()


class WireEngine:
    """An engine behind ``specproof-engine/1`` (see the module docstring and docs/protocol.md)."""

    def __init__(self, transport: _Transport, *, timeout: float = DEFAULT_TIMEOUT, state: bool = True) -> None:
        self._transport = transport
        self.timeout = float(timeout)
        self.spec = transport.describe
        self._next_id = 1
        self._closed = False
        self._broken: str | None = None
        self._last = "(nothing yet)"
        self.drafter: Any = None
        _LIVE.add(self)
        try:
            hello = self._receive(("hello",), "the handshake")
        except BaseException:
            self._kill()
            raise
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
        self.name = f"{self.engine_name} {self.engine_version} via {self.spec}".replace("  ", " ")
        #: send state dumps with every round (capability ``state``); turn off to time the engine
        self.send_state = state and "state" in self.capabilities
        #: the engine's own time for the last generate (``final.elapsed_us``) and its prefill part
        self.last_elapsed_us: float | None = None
        self.last_prefill_us: float | None = None
        self.oracle: Target | None = None
        if self.model is not None:
            try:
                self.oracle = load_target(self.model)
            except Exception as exc:
                self._kill()
                raise EngineProtocolError(
                    f"engine {self.spec}: its handshake names the model {self.model!r}, which is not a target "
                    f"specproof can load: {exc}"
                ) from exc
        if "state" in self.capabilities:
            self.target = WireTargetView(self.vocab_size, self.max_context, self.name)
        if "greedy" in self.capabilities:
            self.greedy = self._greedy

    # ----------------------------------------------------------------- plumbing

    @property
    def stderr_tail(self) -> str:
        """The last lines the engine wrote to stderr (empty over TCP)."""
        return self._transport.stderr_tail

    def describe(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<WireEngine {self.spec} k={getattr(self, 'k', '?')} rollback={getattr(self, 'rollback', '?')}>"

    def _fail(self, what: str, request: str, *, fatal: bool = True) -> EngineProtocolError:
        if fatal:
            self._broken = what
        tail = self.stderr_tail
        text = f"engine {self.spec}, {request}: {what}. Last message received: {_clip(self._last)}" + (
            f"\nengine stderr (tail):\n{tail}" if tail else "\n(the engine wrote nothing to stderr)"
        )
        return EngineProtocolError(text, stderr_tail=tail)

    def _send(self, message: dict[str, Any], request: str) -> None:
        if self._closed:
            raise EngineProtocolError(f"engine {self.spec}: {request}: the engine was closed")
        if self._broken is not None:
            raise self._fail(f"the engine is unusable after an earlier failure ({_clip(self._broken, 200)})", request)
        try:
            self._transport.send(json.dumps(message, separators=(",", ":")))
        except EngineProtocolError as exc:
            raise self._fail(str(exc), request) from None

    def _receive(self, expect: tuple[str, ...], request: str) -> dict[str, Any]:
        try:
            line = self._transport.recv(self.timeout)
        except queue.Empty:
            raise self._fail(
                f"no message within the timeout of {self.timeout:g} s (expected {' or '.join(expect)})", request
            ) from None
        if line is None:
            raise self._fail(f"{self._transport.exit_note()} before sending {' or '.join(expect)}", request)
        self._last = line
        try:
            message = json.loads(line)
        except json.JSONDecodeError as exc:
            raise self._fail(f"invalid JSON ({exc.msg} at column {exc.colno})", request) from None
        try:
            return validate_message(message, expect=expect)
        except EngineProtocolError as exc:
            raise self._fail(str(exc), request) from None

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
            raise self._fail(f"the message answers request #{message.get('id')}, not #{rid}", request)

    # ----------------------------------------------------------------- requests

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        """One speculative generation; drafts from ``self.drafter`` when it is set."""
        tokens = [int(t) for t in prompt]
        rid = self._new_id()
        request = self._request_text("generate", rid, tokens, max_new_tokens)
        drafter = self.drafter
        if drafter is not None:
            if "suite_drafts" not in self.capabilities:
                raise EngineRequestError(
                    f"engine {self.spec}: a drafter was set, but the engine does not take drafts from the suite "
                    f"(its capabilities: {sorted(self.capabilities)})"
                )
            reset = getattr(drafter, "reset", None)
            if callable(reset):
                reset()
        self._send(
            {
                "type": "generate",
                "id": rid,
                "prompt": tokens,
                "max_new_tokens": int(max_new_tokens),
                "eos_token_id": None if eos_token_id is None else int(eos_token_id),
                "drafts": "engine" if drafter is None else "suite",
                "state": self.send_state,
            },
            request,
        )
        ctx = list(tokens)
        steps: list[Step] = []
        started = time.perf_counter()
        while True:
            msg = self._receive(("round", "state", "propose", "final", "error"), request)
            self._check_id(msg, rid, request)
            kind = msg["type"]
            if kind == "round":
                if msg["round"] != len(steps):
                    raise self._fail(f"round record {msg['round']} arrived after {len(steps)} rounds", request)
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
                    raise self._fail("a state message, but the request asked for none", request)
                try:
                    self.target.update(msg)
                except EngineProtocolError as exc:
                    raise self._fail(str(exc), request) from None
            elif kind == "propose":
                self._answer_propose(msg, drafter, ctx, rid, request)
            elif kind == "error":
                raise EngineRequestError(
                    f"engine {self.spec}, {request}: the engine answered with an error: {msg['message']}"
                )
            else:
                self.last_elapsed_us = msg.get("elapsed_us")
                self.last_prefill_us = msg.get("prefill_us")
                self.last_wall_us = (time.perf_counter() - started) * 1e6
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
                    ),
                )

    def _answer_propose(self, msg: dict[str, Any], drafter: Any, ctx: list[int], rid: int, request: str) -> None:
        if drafter is None:
            raise self._fail("the engine asked for a draft (propose), but the request said drafts=engine", request)
        if msg["context_length"] != len(ctx):
            raise self._fail(
                f"propose says the context has {msg['context_length']} tokens, but the prompt and the round "
                f"records make {len(ctx)}",
                request,
            )
        try:
            draft = [int(t) for t in drafter.propose(tuple(ctx), msg["k"])]
        except BaseException:
            # the engine waits for a draft: abandon the request (it answers with an error) and resync
            with contextlib.suppress(EngineProtocolError):
                self._send({"type": "reset", "id": self._new_id()}, request)
                while True:
                    answer = self._receive(("round", "state", "error", "ok", "final"), request)
                    if answer["type"] == "error" and answer.get("id") in (rid, None):
                        break
            raise
        self._send({"type": "draft", "id": rid, "round": msg["round"], "tokens": draft}, request)

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
                f"engine {self.spec}, {request}: the engine answered with an error: {msg['message']}"
            )
        return [int(t) for t in msg["tokens"]]

    def reset(self) -> None:
        """Start a new session: the engine forgets its caches."""
        rid = self._new_id()
        request = self._request_text("reset", rid)
        self._send({"type": "reset", "id": rid}, request)
        msg = self._receive(("ok", "error"), request)
        self._check_id(msg, rid, request)
        if msg["type"] == "error":
            raise EngineRequestError(f"engine {self.spec}, {request}: {msg['message']}")
        view = getattr(self, "target", None)
        if isinstance(view, WireTargetView):
            view.clear()

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
    ) -> None:
        self.argv = _split_command(command)
        transport = _ProcessTransport(self.argv, cwd=None if cwd is None else os.fspath(cwd), env=env)
        super().__init__(transport, timeout=timeout, state=state)

    @property
    def returncode(self) -> int | None:
        transport = self._transport
        assert isinstance(transport, _ProcessTransport)
        return transport.proc.poll()


class TcpEngine(WireEngine):
    """Connect to an engine listening on ``host:port`` (a device on the network, or loopback in tests).

    ``close()`` disconnects and leaves the engine running; ``shutdown()`` stops it.
    """

    shutdown_on_close = False

    def __init__(self, host: str, port: int, *, timeout: float = DEFAULT_TIMEOUT, state: bool = True) -> None:
        super().__init__(_SocketTransport(host, int(port), timeout=timeout), timeout=timeout, state=state)


def engine_from_spec(spec: str, *, timeout: float | None = None) -> Callable[[], WireEngine]:
    """A factory for ``exec:CMD ARGS`` or ``tcp:HOST:PORT`` (timeout: ``$SPECPROOF_WIRE_TIMEOUT`` or 60 s)."""
    if timeout is None:
        timeout = float(os.environ.get("SPECPROOF_WIRE_TIMEOUT", DEFAULT_TIMEOUT))
    kind, _, rest = spec.partition(":")
    if kind == "exec":
        argv = _split_command(rest)
        return lambda: ExecEngine(argv, timeout=timeout)
    if kind == "tcp":
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise EngineProtocolError(f"engine spec {spec!r}: expected tcp:HOST:PORT, for example tcp:127.0.0.1:7070")
        return lambda: TcpEngine(host.strip("[]"), int(port), timeout=timeout)
    raise EngineProtocolError(f"engine spec {spec!r}: expected exec:CMD ARGS or tcp:HOST:PORT")
