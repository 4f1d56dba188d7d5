"""The engines a spec names: ``ExecEngine`` (``exec:CMD ARGS``: a process spoken to on its stdio) and
``TcpEngine`` (``tcp:HOST:PORT``: an engine listening on the network), and ``engine_from_spec``, which
also reads the client's settings from the environment (``$SPECPROOF_WIRE_*``).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence

from specproof.engine import Target
from specproof.wire._digest import DIGEST_KEY_ENV, digest_key
from specproof.wire._engine import DEFAULT_MAX_RESTARTS, DEFAULT_TIMEOUT, STATE_MODES, WireEngine
from specproof.wire._errors import EngineProtocolError
from specproof.wire._transport import ProcessTransport, SocketTransport

__all__ = ["ExecEngine", "TcpEngine", "engine_from_spec"]


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
            lambda limit: ProcessTransport(argv, cwd=where, env=env, limit=limit),
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
        transport = self._channel.transport
        assert isinstance(transport, ProcessTransport)
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
            lambda limit: SocketTransport(host, where, timeout=timeout, limit=limit),
            timeout=timeout,
            state=state,
            full_state=full_state,
            state_mode=state_mode,
            max_line_bytes=max_line_bytes,
            max_restarts=max_restarts,
            load_target=load_target,
        )


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
