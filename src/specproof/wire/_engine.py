"""``WireEngine``: an engine behind ``specproof-engine/1`` as a specproof engine (the contract the suite
consumes). It holds the handshake's facts and options and hands the work to its parts: the conversation
(``_channel``: messages, faults, restarts), the request loop (``_requests``), the drafter and feature
bridge (``_drafts``) and the live state view (``_state_view``).
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from specproof.contract import DecodeParams
from specproof.contract.sampling import SamplingParams
from specproof.engine import Generation, Target
from specproof.engine.targets import load_target as load_engine_target
from specproof.wire import _requests
from specproof.wire._batch import BatchMethods, open_batch
from specproof.wire._channel import Channel
from specproof.wire._decode_ask import DecodeMethods
from specproof.wire._digest import digest_key, request_seed
from specproof.wire._drafts import DraftBridge
from specproof.wire._errors import EngineProtocolError
from specproof.wire._limits import HANDSHAKE_LINE_BYTES, default_line_limit
from specproof.wire._sampling_ask import check_sampling, check_scheme, offered_schemes
from specproof.wire._state_view import WireTargetView
from specproof.wire._transport import Transport
from specproof.wire._trees import TreeMethods

__all__ = ["DEFAULT_MAX_RESTARTS", "DEFAULT_TIMEOUT", "DIGEST_PROJECTIONS", "STATE_MODES", "WireEngine"]

DEFAULT_TIMEOUT = 60.0
#: how the state may travel (docs/protocol.md, ``state``); the default is the first the engine offers
#: of digest, delta, full
STATE_MODES = ("digest", "delta", "full")
#: signed projections per slice in a digest: each one that is missed lets a wrong slice through with
#: chance 1/2 for a two-element swap, so two per slice and many slices make a miss negligible
DIGEST_PROJECTIONS = 2
#: how often a failed engine is restarted in one run before every later request fails at once
DEFAULT_MAX_RESTARTS = 8

_LIVE: weakref.WeakSet[WireEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # pragma: no cover - runs at interpreter exit
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine.close()


def _check_options(
    *, full_state: bool, state_mode: str | None, max_line_bytes: int | None, max_restarts: int
) -> tuple[str, int | None, int]:
    """The state mode, line limit (None: from the handshake) and restarts the options ask for; a
    ``ValueError`` naming the option otherwise."""
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
    return mode, None if max_line_bytes is None else int(max_line_bytes), int(max_restarts)


def _state_ask(capabilities: frozenset[str], state: bool, mode: str) -> tuple[bool, bool, bool]:
    """``(send_state, state_digest, state_delta)``: send state dumps with every round (capability ``state``;
    turn off to time the engine); ask for digests (capability ``state_digest``; the default): signed
    projections per slice instead of values, KV rows the client has seen left out; else KV deltas
    (capability ``state_delta``) unless ``full_state``: rows the client holds are left out and checked by
    CRC-32 (docs/protocol.md, ``state``)."""
    send = state and "state" in capabilities
    digest = send and mode == "digest" and "state_digest" in capabilities
    delta = send and not digest and mode != "full" and "state_delta" in capabilities
    return send, digest, delta


def _load_oracle(
    load_target: Callable[[str], Target], model: str | None, label: str, kill: Callable[[], None]
) -> Target | None:
    """The handshake's ``model`` as a target (None without one); a model specproof cannot load kills the
    engine and is an ``EngineProtocolError``."""
    if model is None:
        return None
    try:
        return load_target(model)
    except Exception as exc:
        kill()
        raise EngineProtocolError(
            f"engine {label}: its handshake names the model {model!r}, which is not a target specproof can load: {exc}"
        ) from exc


class WireEngine(BatchMethods, DecodeMethods, TreeMethods):
    """An engine behind ``specproof-engine/1`` (see the module docstring and docs/protocol.md).

    ``connect(limit)`` makes a transport (starts the process, or connects); it is called again by ``reset()``
    after a fault — at most ``max_restarts`` times — so one crash costs one check its verdict, not the run.
    ``max_line_bytes`` bounds every line the engine sends (default: the handshake's, docs/protocol.md
    "Limits"). ``load_target`` turns the handshake's ``model`` into the oracle (default: engine-level target
    specs only; ``specproof.plugins`` passes its own, which also knows the fixtures)."""

    #: whether ``close()`` asks the engine to exit (a process we started) or only disconnects
    shutdown_on_close = True

    def __init__(
        self,
        connect: Callable[[int], Transport],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        state: bool = True,
        full_state: bool = False,
        state_mode: str | None = None,
        max_line_bytes: int | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        load_target: Callable[[str], Target] | None = None,
    ) -> None:
        mode, limit, restarts = _check_options(
            full_state=full_state, state_mode=state_mode, max_line_bytes=max_line_bytes, max_restarts=max_restarts
        )
        #: keys the digest seeds (``_digest_seed``): secret from the engine, fixed for this client (or
        #: ``$SPECPROOF_WIRE_DIGEST_KEY``, to replay a digest failure's signs)
        self._salt = digest_key()
        #: turns the handshake's ``model`` spec into the oracle (``specproof.plugins.load_target`` knows fixtures)
        self._load_target = load_engine_target if load_target is None else load_target
        _LIVE.add(self)
        self._channel = Channel(
            connect, timeout=timeout, limit=HANDSHAKE_LINE_BYTES if limit is None else limit, max_restarts=restarts
        )
        self._take_hello(self._channel.handshake())
        #: ``send_state``, ``state_digest``, ``state_delta``: how the state travels (``_state_ask``)
        self.send_state, self.state_digest, self.state_delta = _state_ask(self.capabilities, state, mode)
        #: the engine's own time for the last generate (``final.elapsed_us``) and its prefill part
        self.last_elapsed_us: float | None = None
        self.last_prefill_us: float | None = None
        self.oracle: Target | None = _load_oracle(self._load_target, self.model, self.label, self._kill)
        self._channel.set_limit(
            limit
            or default_line_limit(
                self.capabilities,
                oracle=self.oracle,
                max_context=self.max_context,
                feature_layers=self.feature_layers,
                d_model=self.d_model,
            )
        )
        self._bridge = DraftBridge(
            self._channel,
            capabilities=self.capabilities,
            feature_layers=self.feature_layers,
            d_model=self.d_model,
            max_context=self.max_context,
            vocab_size=self.vocab_size,
        )
        self._offer_capabilities()
        self._channel.on_restart = self._forget_state

    def _take_hello(self, hello: dict[str, Any]) -> None:
        """The handshake's facts as attributes (docs/protocol.md, hello)."""
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
        features = "features" in self.capabilities
        #: capability ``features``: the width of a feature row and the layers the engine can hand over
        #: (docs/protocol.md, Features); None without the capability
        self.d_model: int | None = hello["d_model"] if features else None
        self.feature_layers: tuple[int, ...] | None = (
            tuple(int(x) for x in hello["feature_layers"]) if features else None
        )
        #: capability ``sampling``: the rules a request may name (``scheme``), the default first (docs/protocol.md)
        self.sampling_schemes: tuple[str, ...] = offered_schemes(hello, self.capabilities)
        self._scheme: str | None = None
        self.name = f"{self.engine_name} {self.engine_version} via {self.spec}".replace("  ", " ")
        self._channel.label = f"{self.engine_name} ({self.spec})"

    def _offer_capabilities(self) -> None:
        """The attributes the suite looks for, present only with the capability that backs them."""
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
        self._offer_trees()
        #: capability ``sessions``: the engine keeps its caches between requests and says how many prompt
        #: tokens it served from them (``stats.prefix_reused``); ``engine.session`` holds it to the figure
        #: where a ``final`` reports it (docs/protocol.md, Compatibility)
        self.reuses_prefix: bool = "sessions" in self.capabilities
        if "suite_drafts" in self.capabilities:
            #: the suite's drafter (capability ``suite_drafts``); absent otherwise, so the suite
            #: judges the engine on its own drafts
            self.drafter: Any = None
        # capability ``batched``: a ``BatchEngine`` too (protocol.md, Batches); else the batch checks skip it
        self._batch = open_batch(self)
        if self._batch is not None:
            self.batch_capabilities = self._batch.batch_capabilities

    # ----------------------------------------------------------------- the conversation's facts

    @property
    def spec(self) -> str:
        """How the engine was reached: ``exec:CMD ARGS`` or ``tcp:HOST:PORT``."""
        return self._channel.spec

    @property
    def label(self) -> str:
        """How errors name the engine: the handshake's name, then how it was reached."""
        return self._channel.label

    @property
    def timeout(self) -> float:
        """Seconds to wait for each message."""
        return self._channel.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._channel.timeout = float(value)

    @property
    def max_restarts(self) -> int:
        return self._channel.max_restarts

    @max_restarts.setter
    def max_restarts(self, value: int) -> None:
        self._channel.max_restarts = int(value)

    @property
    def restarts(self) -> int:
        return self._channel.restarts

    @property
    def faults(self) -> list[str]:
        """Every fault seen (the first is the one later errors name); one entry per restart."""
        return self._channel.faults

    @property
    def traffic(self) -> dict[str, float]:
        """What went over the wire (see ``wire_summary()``)."""
        return self._channel.traffic

    @property
    def max_line_bytes(self) -> int:
        """The longest line accepted from the engine (bytes; docs/protocol.md, "Limits")."""
        return self._channel.limit

    @property
    def last_drafts_sent(self) -> dict[int, list[int]]:
        """The draft the suite sent for each round of the last generate (round -> tokens)."""
        return self._bridge.last_drafts_sent

    @property
    def stderr_tail(self) -> str:
        """The last lines the engine wrote to stderr (empty over TCP).

        What is already in the pipe is taken first (``settle_stderr``, at most 0.5 s): a reader
        thread not yet scheduled otherwise hides lines written long before (seen: 9 in 200 reads
        at load 7 missed the engine's first line)."""
        return self._channel.stderr_tail

    @property
    def scheme(self) -> str | None:
        """The acceptance rule sampled requests use: the one set (one of ``sampling_schemes``; None sets the
        engine's default), else the default (the first offered); None when the engine offers none."""
        return self._scheme or next(iter(self.sampling_schemes), None)

    @scheme.setter
    def scheme(self, value: str | None) -> None:
        self._scheme = check_scheme(value, self.sampling_schemes, self.label)

    def describe(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<WireEngine {self.spec} k={getattr(self, 'k', '?')} rollback={getattr(self, 'rollback', '?')}>"

    def wire_summary(self) -> dict[str, object]:
        """Traffic and protocol overhead so far (the certificate shows it; docs/protocol.md): see
        ``Channel.summary``; ``state`` says how the state travels (``state_kind()``)."""
        return self._channel.summary(state=self.state_kind())

    def state_kind(self) -> str:
        """How the state travels: ``digests``, ``deltas``, ``full arrays`` or ``none`` (the ``wire:`` line)."""
        if not self.send_state:
            return "none"
        return "digests" if self.state_digest else "deltas" if self.state_delta else "full arrays"

    def _digest_seed(self, prompt: list[int], max_new_tokens: int, eos_token_id: int | None) -> int:
        """The signs' seed for a request (``_digest.request_seed`` with this client's secret salt)."""
        return request_seed(self._salt, prompt, max_new_tokens, eos_token_id)

    # ----------------------------------------------------------------- requests

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        """One generation, drafted by ``self.drafter`` when set; ``sampling``, ``decode``: see DecodeMethods."""
        check_sampling(sampling, self.capabilities, self.label)
        tokens = [int(t) for t in prompt]
        digest = (
            (self._digest_seed(tokens, max_new_tokens, eos_token_id), DIGEST_PROJECTIONS) if self.state_digest else None
        )
        generation, timing = _requests.generate(
            self._channel,
            self._bridge,
            getattr(self, "target", None),
            tokens,
            max_new_tokens,
            eos_token_id=eos_token_id,
            drafter=getattr(self, "drafter", None),
            state=_requests.StateAsk(send=self.send_state, delta=self.state_delta, digest=digest),
            sampling=sampling,
            scheme=self._scheme,
            decode=self._decode_ask(decode),
        )
        self.last_elapsed_us, self.last_prefill_us = timing.elapsed_us, timing.prefill_us
        self.last_wall_us = timing.wall_us
        return generation

    def _greedy(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> list[int]:
        """Plain greedy decoding by the engine (capability ``greedy``)."""
        return _requests.greedy(self._channel, prompt, max_new_tokens, eos_token_id=eos_token_id)

    def reset(self) -> None:
        """Start a new session: the engine forgets its caches.

        After a fault (``EngineProtocolError``) every request first restarts the engine — a
        new process, or a new connection — at most ``max_restarts`` times in all.
        """
        _requests.reset(self._channel)
        self._forget_state()

    def _forget_state(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._batch.forget()  # type: ignore[union-attr]
        view = getattr(self, "target", None)
        if isinstance(view, WireTargetView):
            view.clear()

    # ----------------------------------------------------------------- closing

    def close(self, *, timeout: float = 5.0) -> None:
        """End the conversation; idempotent.

        ``ExecEngine``: send ``shutdown``, wait ``timeout`` seconds, then kill the process.
        ``TcpEngine``: only disconnect (the engine goes on listening for the next session);
        ``shutdown()`` stops it.
        """
        if self._channel.closed:
            return
        if self.shutdown_on_close:
            self.shutdown(timeout=timeout)
        self._kill(timeout)

    def shutdown(self, *, timeout: float = 5.0) -> None:
        """Send ``shutdown`` and wait up to ``timeout`` seconds for its ``ok``; then close."""
        self._channel.shutdown(timeout)
        self._kill(timeout)

    def _kill(self, timeout: float = 0.0) -> None:
        _LIVE.discard(self)
        self._channel.kill(timeout)

    def __enter__(self) -> WireEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not self._channel.closed:
                self._kill(1.0)
