"""The request loop: ``generate``, ``greedy`` and ``reset`` requests, and the messages that answer them
turned into the suite's records (a ``Generation`` with every round's ``Step`` and the ``Stats``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs

from specproof.contract import TokenLogprob
from specproof.contract.sampling import SamplingParams
from specproof.engine import Generation, Stats, Step
from specproof.wire._channel import Channel, request_text
from specproof.wire._decode_ask import DecodeAsk
from specproof.wire._drafts import DraftBridge
from specproof.wire._errors import EngineProtocolError, EngineRequestError
from specproof.wire._state_view import WireTargetView

__all__ = ["StateAsk", "Timing", "generate", "greedy", "reset"]


@attrs.frozen
class StateAsk:
    """How a ``generate`` asks for the state: none (``send`` False), whole arrays, deltas, or digests
    (``digest``: the seed and projections per slice)."""

    send: bool
    delta: bool = False
    digest: tuple[int, int] | None = None


@attrs.frozen
class Timing:
    """One generation's clocks (microseconds): the engine's own (``final.elapsed_us``, ``prefill_us``;
    None when it sends none), the client's wall time and the suite drafter's time."""

    elapsed_us: float | None
    prefill_us: float | None
    wall_us: float
    drafter_us: float


def generate(
    channel: Channel,
    bridge: DraftBridge,
    view: WireTargetView | None,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    eos_token_id: int | None,
    drafter: Any,
    state: StateAsk,
    sampling: SamplingParams | None = None,
    scheme: str | None = None,
    decode: DecodeAsk | None = None,
) -> tuple[Generation, Timing]:
    """One ``generate`` request and its answer (drafts from ``drafter`` when it is not None; sampled with
    ``sampling`` and the acceptance rule ``scheme`` when they are not None; ``decode``: the decode-state
    fields and the list each round's ``processor`` state goes into, when asked for)."""
    tokens = [int(t) for t in prompt]
    rid = channel.new_id()
    request = request_text("generate", rid, tokens, max_new_tokens)
    if sampling is not None:
        request = f"{request[:-1]}, sampling {sampling.describe()}{f', scheme {scheme}' if scheme else ''})"
    layers = bridge.prepare(drafter)
    # the wall clock starts before the request goes out: the engine's own clock may start before
    # this process runs again (a loaded machine), and sending is the protocol's cost anyway
    started = time.perf_counter()
    message: dict[str, Any] = {
        "type": "generate",
        "id": rid,
        "prompt": tokens,
        "max_new_tokens": int(max_new_tokens),
        "eos_token_id": None if eos_token_id is None else int(eos_token_id),
        "drafts": "engine" if drafter is None else "suite",
        "state": state.send,
        **({"state_delta": True} if state.delta else {}),
        **({"state_digest": {"seed": state.digest[0], "projections": state.digest[1]}} if state.digest else {}),
        **({"feature_layers": list(layers)} if layers else {}),
        **({"sampling": sampling.to_json()} if sampling is not None else {}),
        **({"scheme": scheme} if sampling is not None and scheme is not None else {}),
        **(decode.fields if decode is not None else {}),
    }
    channel.send(message, request)
    bridge.begin(layers, sampling)
    if state.send:
        assert view is not None
        view.begin_request(digest=state.digest)
    rounds = _Rounds(channel, bridge, view, state, drafter, rid=rid, request=request, prompt=tokens)
    if decode is not None:
        rounds.want_logprobs = bool(decode.fields.get("logprobs"))
        rounds.processor_states = decode.processor_states
    generation, elapsed_us, prefill_us = rounds.run(max_new_tokens)
    timing = Timing(elapsed_us, prefill_us, (time.perf_counter() - started) * 1e6, rounds.drafter_us)
    _count(channel.traffic, len(rounds.steps), timing)
    return generation, timing


def _count(traffic: dict[str, float], steps: int, timing: Timing) -> None:
    traffic["generations"] += 1
    traffic["rounds"] += steps
    if timing.elapsed_us is not None and steps:
        traffic["timed_rounds"] += steps
        traffic["wall_us"] += timing.wall_us
        traffic["engine_us"] += float(timing.elapsed_us)
        traffic["drafter_us"] += timing.drafter_us


class _Rounds:
    """The messages answering one ``generate``, read until its ``final``."""

    def __init__(
        self,
        channel: Channel,
        bridge: DraftBridge,
        view: WireTargetView | None,
        state: StateAsk,
        drafter: Any,
        *,
        rid: int,
        request: str,
        prompt: list[int],
    ) -> None:
        self.channel, self.bridge, self.view, self.state, self.drafter = channel, bridge, view, state, drafter
        self.rid, self.request = rid, request
        self.ctx = list(prompt)
        self.steps: list[Step] = []
        self.states = 0
        self.drafter_us = 0.0  # the suite's drafter: neither the engine's time nor the protocol's
        self.want_logprobs = False  # the request asked for final.logprobs
        self.processor_states: list[dict[str, Any]] | None = None  # asked for: each round's processor state

    def run(self, max_new_tokens: int) -> tuple[Generation, float | None, float | None]:
        """The generation and the engine's ``elapsed_us`` and ``prefill_us``."""
        channel, request = self.channel, self.request
        # every round emits a token: at most a state, a propose and a round per round, a state at the end
        budget = 3 * (max(0, int(max_new_tokens)) + 1) + 2
        while True:
            budget -= 1
            if budget < 0:
                channel.fault(
                    f"more messages than {max_new_tokens} new tokens allow (3 per round and a final state)", request
                )
            msg = channel.receive(("round", "state", "propose", "final", "error"), request)
            channel.check_id(msg, self.rid, request)
            kind = msg["type"]
            if kind == "round":
                self._round(msg)
            elif kind == "state":
                self._state(msg)
            elif kind == "propose":
                self.drafter_us += self.bridge.answer(msg, self.drafter, self.ctx, self.rid, request)
            elif kind == "error":
                raise EngineRequestError(
                    f"engine {channel.label}, {request}: the engine answered with an error: {msg['message']}"
                )
            else:
                return self._final(msg), msg.get("elapsed_us"), msg.get("prefill_us")

    def _round(self, msg: dict[str, Any]) -> None:
        if msg["round"] != len(self.steps):
            self.channel.fault(f"round record {msg['round']} arrived after {len(self.steps)} rounds", self.request)
        self.steps.append(
            Step(
                base=msg["base"],
                draft=msg["draft"],
                argmax=msg["argmax"],
                accepted=msg["accepted"],
                processed=msg["processed"],
            )
        )
        self.ctx.extend(msg["accepted"])
        if self.processor_states is not None:
            state = msg.get("processor")
            if state is None:
                self.channel.fault(
                    f"the request asked for the processor state, but round {msg['round']} carries none "
                    "(docs/protocol.md, Decode state)",
                    self.request,
                )
            self.processor_states.append(state)

    def _state(self, msg: dict[str, Any]) -> None:
        if not self.state.send:
            self.channel.fault("a state message, but the request asked for none", self.request)
        assert self.view is not None
        self.states += 1
        try:
            self.view.update(msg, delta=self.state.delta)
        except EngineProtocolError as exc:
            self.channel.fault(str(exc), self.request)

    def _final(self, msg: dict[str, Any]) -> Generation:
        steps = self.steps
        if self.state.send and self.states != len(steps) + 1:
            self.channel.fault(
                f"the request asked for the state (capability 'state': one state message before every "
                f"round and one after the last), but the engine sent {self.states} for {len(steps)} rounds "
                "(docs/protocol.md, state)",
                self.request,
            )
        return Generation(
            tokens=msg["tokens"],
            stop_reason=msg["stop_reason"],
            steps=tuple(steps),
            stats=_stats(msg.get("stats")),
            logprobs=self._logprobs(msg),
        )

    def _logprobs(self, msg: dict[str, Any]) -> tuple[TokenLogprob, ...] | None:
        """``final.logprobs`` when the request asked for them: one per emitted token, else a fault (never a
        placeholder); None when not asked (an engine's unasked logprobs are ignored)."""
        if not self.want_logprobs:
            return None
        values = msg.get("logprobs")
        if values is None or len(values) != len(msg["tokens"]):
            have = "none" if values is None else f"{len(values)}"
            self.channel.fault(
                f"the request asked for logprobs, but the final carries {have} for {len(msg['tokens'])} tokens "
                "(docs/protocol.md, Decode state)",
                self.request,
            )
        return tuple(TokenLogprob(token=t, logprob=v) for t, v in zip(msg["tokens"], values, strict=True))


def _stats(stats: dict[str, Any] | None) -> Stats | None:
    if stats is None:
        return None
    return Stats(
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
    )


def greedy(channel: Channel, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None) -> list[int]:
    """Plain greedy decoding by the engine (capability ``greedy``)."""
    tokens = [int(t) for t in prompt]
    rid = channel.new_id()
    request = request_text("greedy", rid, tokens, max_new_tokens)
    message: dict[str, Any] = {"type": "greedy", "id": rid, "prompt": tokens, "max_new_tokens": int(max_new_tokens)}
    if eos_token_id is not None:
        message["eos_token_id"] = int(eos_token_id)
    channel.send(message, request)
    msg = channel.receive(("final", "error"), request)
    channel.check_id(msg, rid, request)
    if msg["type"] == "error":
        raise EngineRequestError(
            f"engine {channel.label}, {request}: the engine answered with an error: {msg['message']}"
        )
    return [int(t) for t in msg["tokens"]]


def reset(channel: Channel) -> None:
    """A ``reset`` request: the engine forgets its caches."""
    rid = channel.new_id()
    request = request_text("reset", rid)
    channel.send({"type": "reset", "id": rid}, request)
    msg = channel.receive(("ok", "error"), request)
    channel.check_id(msg, rid, request)
    if msg["type"] == "error":
        raise EngineRequestError(f"engine {channel.label}, {request}: {msg['message']}")
