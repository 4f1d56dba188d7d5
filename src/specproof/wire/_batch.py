"""The batched conversation (capability ``batched``): ``add_request``, ``step``, ``abort`` and ``preempt``
over ``specproof-engine/1``, as the suite's ``BatchEngine`` (docs/protocol.md, Batches).

The client keeps each request's context and round records from the ``stepped`` answers, answers every
``propose`` of a step with that request's own drafter (``propose.request`` names it), and holds the
engine's answers to what it can check without a model: only requests it added, each at most once a
step, rounds in order, emitted tokens a prefix of the round's accepted ones and a finished request's
tokens the ones its steps emitted. Anything else is a fault naming the message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from typing import Any

import attrs

from specproof.contract import BatchCapabilities, BatchRequest, Generation, RequestOutput, Step
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.wire._channel import Channel
from specproof.wire._drafts import DraftBridge
from specproof.wire._errors import EngineProtocolError, EngineRequestError
from specproof.wire._requests import reset
from specproof.wire._sampling_ask import check_sampling

__all__ = ["BatchMethods", "WireBatch", "batch_capabilities", "open_batch"]

MAX_REQUEST_ID = 256  # the schemas' maxLength of a request id


def batch_capabilities(batch: dict[str, Any], *, sampling: bool = True) -> BatchCapabilities:
    """The handshake's ``batch`` object as ``BatchCapabilities`` (no per-slot state travels over the wire;
    ``sampling``: the handshake declares the capability ``sampling``)."""
    return BatchCapabilities(
        max_batch=batch["max_batch"],
        slots=batch["slots"],
        continuous_arrivals=bool(batch.get("continuous_arrivals", False)),
        preemption=tuple(batch.get("preemption", ())),
        schedulable=bool(batch.get("schedulable", False)),
        per_slot_state=False,
        batch_invariant_seeding=bool(batch.get("batch_invariant_seeding", False)),
        sampling=sampling,
    )


@attrs.define
class _Held:
    """A request in the engine as the client knows it: its context, output and rounds so far."""

    request: BatchRequest
    drafts: bool  # the suite drafts for it
    bridge: DraftBridge
    ctx: list[int]
    out: list[int] = attrs.Factory(list)
    steps: list[Step] = attrs.Factory(list)


def _propose_problem(asked: Any, held: _Held | None, allowed: set[str], proposed: set[str]) -> str:
    """What is wrong with a ``propose`` in a step that names request ``asked``."""
    if not isinstance(asked, str):
        return "names no request (propose.request is required in a step)"
    if held is None or asked not in allowed:
        return f"names {asked!r}, which is not a request in this step"
    if not held.drafts:
        return f"is for {asked!r}, which drafts itself (drafts=engine)"
    return f"asks for a second draft for {asked!r} in one step"


class WireBatch:
    """A ``BatchEngine`` over ``channel`` (see the module docstring)."""

    def __init__(
        self,
        channel: Channel,
        *,
        batch: dict[str, Any],
        capabilities: frozenset[str],
        max_context: int,
        vocab_size: int,
    ) -> None:
        self._channel = channel
        self._capabilities = capabilities
        self._max_context = max_context
        self._vocab_size = vocab_size
        self.batch_capabilities = batch_capabilities(batch, sampling="sampling" in capabilities)
        self.scheme: str | None = None
        self._held: dict[str, _Held] = {}

    def forget(self) -> None:
        """The engine forgot every request (a reset, or a restart after a fault)."""
        self._held.clear()

    def has_unfinished_requests(self) -> bool:
        return bool(self._held)

    def add_request(self, request: BatchRequest) -> None:
        """Queue ``request`` (checked before anything is sent: a duplicate id, sampling the engine lacks)."""
        if not isinstance(request, BatchRequest):
            raise InvalidSettingError(f"add_request takes a BatchRequest, got {type(request).__name__}")
        label = self._channel.label
        if request.request_id in self._held:
            raise InvalidSettingError(f"engine {label}: request_id {request.request_id!r} is already in the engine")
        if len(request.request_id) > MAX_REQUEST_ID:
            raise InvalidSettingError(
                f"engine {label}: request_id of {len(request.request_id)} characters: at most {MAX_REQUEST_ID} travel "
                "(docs/protocol.md, Batches)"
            )
        check_sampling(request.sampling, self._capabilities, label)
        if request.decode is not None and (request.decode.features() or request.decode.eos_token_ids):
            # specproof-engine/1 carries decode parameters on generate only: refused, never dropped
            raise UnsupportedParameterError(
                f"engine {label}: add_request carries no decode parameters in specproof-engine/1 "
                f"({', '.join(sorted(request.decode.features()) or ['eos_token_ids'])}); nothing was sent "
                "(docs/protocol.md, Decode state)"
            )
        # the suite drafts where the engine takes drafts (capability suite_drafts), else the engine's own drafts
        drafts = request.drafter is not None and "suite_drafts" in self._capabilities
        bridge = DraftBridge(
            self._channel,
            capabilities=self._capabilities,
            feature_layers=None,
            d_model=None,
            max_context=self._max_context,
            vocab_size=self._vocab_size,
        )
        bridge.prepare(request.drafter if drafts else None)
        bridge.begin((), request.sampling)
        rid = self._channel.new_id()
        text = f"add_request #{rid} ({request.request_id!r})"
        message: dict[str, Any] = {
            "type": "add_request",
            "id": rid,
            "request": request.request_id,
            "prompt": list(request.prompt),
            "max_new_tokens": request.max_new_tokens,
            "eos_token_id": request.eos_token_id,
            "drafts": "suite" if drafts else "engine",
            **({"sampling": request.sampling.to_json()} if request.sampling is not None else {}),
            **({"scheme": self.scheme} if request.sampling is not None and self.scheme is not None else {}),
        }
        self._channel.send(message, text)
        self._answer_ok(rid, text)
        self._held[request.request_id] = _Held(request=request, drafts=drafts, bridge=bridge, ctx=list(request.prompt))

    def preempt(self, request_id: str, *, mode: str) -> None:
        """Evict ``request_id`` (``mode`` one of the handshake's ``batch.preemption``)."""
        modes = self.batch_capabilities.preemption
        if mode not in modes:
            raise InvalidSettingError(
                f"engine {self._channel.label}: preempt mode={mode!r} is not one the engine declares ({list(modes)})"
            )
        self._get(request_id)
        rid = self._channel.new_id()
        text = f"preempt #{rid} ({request_id!r}, {mode})"
        self._channel.send({"type": "preempt", "id": rid, "request": request_id, "mode": mode}, text)
        self._answer_ok(rid, text)

    def abort_request(self, request_id: str) -> Generation:
        """Cancel ``request_id``; returns what it had emitted (stop reason ``error``)."""
        self._get(request_id)
        rid = self._channel.new_id()
        text = f"abort #{rid} ({request_id!r})"
        self._channel.send({"type": "abort", "id": rid, "request": request_id}, text)
        msg = self._receive(("stepped", "error"), rid, text)
        outputs = msg["outputs"]
        if len(outputs) != 1 or outputs[0]["request"] != request_id or outputs[0]["finished"] is None:
            self._channel.fault(f"the answer to abort must be one finished output for {request_id!r}", text)
        out = self._output(outputs[0], {request_id}, text)
        assert out.finished is not None
        return out.finished

    def step(self, *, only: Collection[str] | None = None) -> list[RequestOutput]:
        """One verify round; every ``propose`` the engine sends on the way is answered by its request's drafter."""
        label, channel = self._channel.label, self._channel
        names = None if only is None else list(dict.fromkeys(str(n) for n in only))  # each once, in order
        if names is not None:
            if not self.batch_capabilities.schedulable:
                raise InvalidSettingError(f"engine {label}: step(only=...) needs batch.schedulable, which it lacks")
            for name in names:
                self._get(name)
        rid = channel.new_id()
        text = f"step #{rid}" + ("" if names is None else f" (only {names})")
        channel.send({"type": "step", "id": rid, **({"only": names} if names is not None else {})}, text)
        allowed = set(self._held) if names is None else set(names)
        try:
            msg = self._converse(rid, text, allowed)
        except EngineProtocolError:
            raise  # a fault: the next request restarts the engine, and the client forgets every request then
        except BaseException:
            # an error answering the step (or the suite's drafter raising) may leave requests half-advanced:
            # the client resets the engine, dropping every request on both sides (docs/protocol.md, Batches)
            self.forget()
            with contextlib.suppress(Exception):
                reset(channel)
            raise
        outputs = [self._output(o, allowed, text) for o in msg["outputs"]]
        if len({o.request_id for o in outputs}) != len(outputs):
            channel.fault("a stepped message with two outputs for one request", text)
        return outputs

    def _converse(self, rid: int, text: str, allowed: set[str]) -> dict[str, Any]:
        """Answer the step's ``propose`` messages with each request's drafter; its ``stepped`` answer."""
        proposed: set[str] = set()
        while True:
            msg = self._receive(("propose", "stepped", "error"), rid, text)
            if msg["type"] == "stepped":
                return msg
            asked: Any = msg.get("request")
            held = self._held.get(asked) if isinstance(asked, str) else None
            if held is None or asked not in allowed or not held.drafts or asked in proposed:
                self._channel.fault(f"a propose that {_propose_problem(asked, held, allowed, proposed)}", text)
            proposed.add(asked)
            held.bridge.answer(msg, held.request.drafter, held.ctx, rid, text)

    # ----------------------------------------------------------------- the answers

    def _get(self, request_id: str) -> _Held:
        held = self._held.get(request_id)
        if held is None:
            raise InvalidSettingError(f"engine {self._channel.label}: no request {request_id!r} in the engine")
        return held

    def _receive(self, expect: tuple[str, ...], rid: int, text: str) -> dict[str, Any]:
        msg = self._channel.receive(expect, text)
        self._channel.check_id(msg, rid, text)
        if msg["type"] == "error":
            raise EngineRequestError(
                f"engine {self._channel.label}, {text}: the engine answered with an error: {msg['message']}"
            )
        return msg

    def _answer_ok(self, rid: int, text: str) -> None:
        self._receive(("ok", "error"), rid, text)

    def _output(self, entry: dict[str, Any], allowed: set[str], text: str) -> RequestOutput:
        """One ``stepped`` output as a ``RequestOutput``, checked against what the client holds."""
        channel, name = self._channel, entry["request"]
        held = self._held.get(name)
        if held is None or name not in allowed:
            channel.fault(f"an output for {name!r}, which is not a request in this step", text)
        tokens = [int(t) for t in entry["tokens"]]
        step = None
        record = entry["round"]
        if record is not None:
            if record["round"] != len(held.steps):
                channel.fault(f"{name!r}'s round record {record['round']} after {len(held.steps)} rounds", text)
            if tokens != record["accepted"][: len(tokens)]:
                channel.fault(
                    f"{name!r} emitted {tokens}, not a prefix of its accepted tokens {record['accepted']}", text
                )
            step = Step(
                base=record["base"],
                draft=record["draft"],
                argmax=record["argmax"],
                accepted=record["accepted"],
                processed=record["processed"],
            )
            held.steps.append(step)
        elif tokens:
            channel.fault(f"{name!r} emitted {tokens} without a round", text)
        held.out.extend(tokens)
        held.ctx.extend(tokens)
        finished = None
        if entry["finished"] is not None:
            done = entry["finished"]
            if list(done["tokens"]) != held.out:
                channel.fault(f"{name!r} finished with tokens {done['tokens']}, but its steps emitted {held.out}", text)
            finished = Generation(tokens=held.out, stop_reason=done["stop_reason"], steps=tuple(held.steps))
            del self._held[name]
        return RequestOutput(request_id=name, step=step, new_tokens=tokens, finished=finished, slot=entry.get("slot"))


def open_batch(engine: Any) -> WireBatch | None:
    """The batched conversation of a ``WireEngine`` whose handshake declared ``batched`` (None: it does not batch)."""
    if "batched" not in engine.capabilities:
        return None
    return WireBatch(
        engine._channel,
        batch=engine.hello["batch"],
        capabilities=engine.capabilities,
        max_context=engine.max_context,
        vocab_size=engine.vocab_size,
    )


class BatchMethods:
    """``WireEngine``'s ``BatchEngine`` half: each method hands over to its ``WireBatch``, or refuses, sending
    nothing, when the handshake declared no ``batched``."""

    _batch: WireBatch | None
    _scheme: str | None
    capabilities: frozenset[str]

    @property
    def label(self) -> str:  # WireEngine's: the engine's name and spec, for messages
        raise NotImplementedError

    def _batched(self) -> WireBatch:
        if self._batch is None:
            raise EngineRequestError(
                f"engine {self.label}: it does not batch (no capability 'batched' in its handshake: "
                f"{sorted(self.capabilities)}); nothing was sent"
            )
        self._batch.scheme = self._scheme
        return self._batch

    def add_request(self, request: BatchRequest) -> None:
        """Queue one request of a batch (``BatchEngine``; docs/protocol.md, Batches)."""
        self._batched().add_request(request)

    def step(self, *, only: Collection[str] | None = None) -> list[RequestOutput]:
        """One verify round of the running requests (``only``: just those, with ``batch.schedulable``)."""
        return self._batched().step(only=only)

    def abort_request(self, request_id: str) -> Generation:
        """Cancel a request and free its slot; returns what it had emitted."""
        return self._batched().abort_request(request_id)

    def preempt(self, request_id: str, *, mode: str) -> None:
        """Evict a running request (``mode``: one of ``batch_capabilities.preemption``)."""
        self._batched().preempt(request_id, mode=mode)

    def has_unfinished_requests(self) -> bool:
        return self._batched().has_unfinished_requests()
