"""The drafter and feature bridge (capabilities ``suite_drafts`` and ``features``): the engine asks for
every draft with ``propose``; the suite's drafter answers, a feature drafter with the feature rows the
engine sent (docs/protocol.md, Features), a sampling drafter in a sampled request with its tokens drawn
by the client's own generator and their ``q`` rows (docs/protocol.md, Sampling).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from specproof.contract.sampling import SamplingParams
from specproof.engine.conventions import check_proposal_rows, component_name
from specproof.wire._channel import Channel
from specproof.wire._errors import EngineProtocolError, EngineRequestError
from specproof.wire._limits import check_feature_shape
from specproof.wire._q_rows import encode_q_rows
from specproof.wire._state_view import decode_float32

__all__ = ["DraftBridge", "drafter_generator"]


def drafter_generator(sampling: SamplingParams) -> np.random.Generator:
    """The client's generator for the suite drafter's draws in a sampled request: seeded by ``[seed, 1]``
    (the engine's own generator, seeded by ``seed``, is not visible to the client), fresh entropy
    without a seed (docs/protocol.md, Sampling)."""
    return np.random.default_rng(None if sampling.seed is None else [sampling.seed, 1])


class DraftBridge:
    """Answers ``propose`` with the suite drafter's draft over ``channel``.

    ``capabilities``, ``feature_layers`` and ``d_model`` are the handshake's (``feature_layers`` and
    ``d_model`` None without the capability ``features``).
    """

    def __init__(
        self,
        channel: Channel,
        *,
        capabilities: frozenset[str],
        feature_layers: tuple[int, ...] | None,
        d_model: int | None,
        max_context: int,
        vocab_size: int,
    ) -> None:
        self._channel = channel
        self._vocab_size = vocab_size
        self._capabilities = capabilities
        self._feature_layers = feature_layers
        self._d_model = d_model
        self._max_context = max_context
        #: the draft sent for each round of the current (or last) generate (round -> tokens)
        self.last_drafts_sent: dict[int, list[int]] = {}
        #: the features the engine sent in the current request: [len(layers), rows, d_model] (None: none asked)
        self._rows: npt.NDArray[np.float32] | None = None
        self._asked: tuple[int, ...] = ()
        #: the current request's sampling parameters and the drafter's generator (None: greedy)
        self._sampling: SamplingParams | None = None
        self._rng: np.random.Generator | None = None

    def prepare(self, drafter: Any) -> tuple[int, ...]:
        """Before a request with ``drafter`` (None: the engine's own drafts): check the engine takes drafts,
        reset the drafter; returns the feature layers to ask for."""
        if drafter is None:
            return ()
        if "suite_drafts" not in self._capabilities:
            raise EngineRequestError(
                f"engine {self._channel.label}: a drafter was set, but the engine does not take drafts from the "
                f"suite (its capabilities: {sorted(self._capabilities)})"
            )
        layers = self._features_to_ask(drafter)
        reset = getattr(drafter, "reset", None)
        if callable(reset):
            reset()
        return layers

    def begin(self, layers: tuple[int, ...], sampling: SamplingParams | None = None) -> None:
        """A request went out asking for the features of ``layers`` (none: empty), sampling with ``sampling``
        (None: greedy)."""
        self._sampling = sampling
        self._rng = None if sampling is None else drafter_generator(sampling)
        self._asked = layers
        self._rows = np.zeros((len(layers), 0, self._d_model or 0), np.float32) if layers else None
        self.last_drafts_sent = {}

    def _features_to_ask(self, drafter: Any) -> tuple[int, ...]:
        """The layers to ask the engine for: the drafter's ``feature_layers`` when the engine has the
        capability ``features`` (else none: a feature drafter then computes its features itself)."""
        raw = getattr(drafter, "feature_layers", None)
        if raw is None or self._feature_layers is None:
            return ()
        layers = tuple(int(x) for x in raw)
        for layer in layers:
            if layer not in self._feature_layers:
                raise EngineRequestError(
                    f"engine {self._channel.label}: the drafter reads the features of layer {layer}, which the "
                    f"engine does not report (its handshake's feature_layers: {list(self._feature_layers)}); "
                    "nothing was sent"
                )
        return layers

    def _take_features(self, msg: dict[str, Any], request: str) -> dict[int, npt.NDArray[np.float32]] | None:
        """The features to hand the drafter: the rows held after this propose's ``features`` (None: none asked)."""
        held = self._rows
        sent = msg.get("features")
        if held is None:
            if sent is not None:
                self._channel.fault(
                    "a propose with features, but the request asked for none (no feature_layers)", request
                )
            return None
        if sent is not None:
            layers, d_model = len(self._asked), held.shape[2]
            try:
                start, rows = check_feature_shape(
                    sent, held=held.shape[1], layers=layers, d_model=d_model, max_context=self._max_context
                )
                _, new = decode_float32(sent["data"], (layers, rows, d_model), "propose features.data")
            except EngineProtocolError as exc:
                self._channel.fault(str(exc), request)
            held = np.concatenate([held[:, :start], new], axis=1)
            held.flags.writeable = False
            self._rows = held
        # exactly the rows the engine sent, however many: engine.features judges the count too
        return {layer: held[i] for i, layer in enumerate(self._asked)}

    def answer(self, msg: dict[str, Any], drafter: Any, ctx: list[int], rid: int, request: str) -> float:
        """Send the drafter's answer to the ``propose`` ``msg``; returns the microseconds the drafter took.

        Only ``propose`` itself is timed: once the draft is sent the engine computes again, so a clock
        read after the send (late when this process is descheduled) would subtract engine time twice
        from the overhead estimate (measured: negative overheads under load before).
        """
        channel = self._channel
        if drafter is None:
            channel.fault("the engine asked for a draft (propose), but the request said drafts=engine", request)
        if msg["context_length"] != len(ctx):
            channel.fault(
                f"propose says the context has {msg['context_length']} tokens, but the prompt and the round "
                f"records make {len(ctx)}",
                request,
            )
        features = self._take_features(msg, request)
        kwargs: dict[str, Any] = {} if features is None else {"features": features}
        started = time.perf_counter()
        q_rows = None
        try:
            sampled = getattr(drafter, "propose_sampled", None)
            if self._sampling is not None and callable(sampled):
                proposal = sampled(tuple(ctx), msg["k"], sampling=self._sampling, rng=self._rng, **kwargs)
                draft = [int(t) for t in proposal.tokens]
                q = check_proposal_rows(
                    proposal.q,
                    draft,
                    vocab_size=self._vocab_size,
                    drafter=component_name(drafter),
                    round_index=int(msg["round"]),
                )
                q_rows = encode_q_rows(q, draft)
            else:
                draft = [int(t) for t in drafter.propose(tuple(ctx), msg["k"], **kwargs)]
        except BaseException:
            self._abandon(rid, request)
            raise
        spent_us = (time.perf_counter() - started) * 1e6
        answer: dict[str, Any] = {"type": "draft", "id": rid, "round": msg["round"], "tokens": draft}
        if "request" in msg:  # a step of a batched engine: say which request the draft is for
            answer["request"] = msg["request"]
        if q_rows is not None:
            answer["q"] = q_rows
        channel.send(answer, request)
        self.last_drafts_sent[int(msg["round"])] = draft
        return spent_us

    def _abandon(self, rid: int, request: str) -> None:
        """The drafter raised while the engine waits for a draft: abandon the request (the engine answers
        it with an error) and read up to that error, so the engine stays usable."""
        channel = self._channel
        with contextlib.suppress(EngineProtocolError):
            channel.send({"type": "reset", "id": channel.new_id()}, request)
            while True:
                answer = channel.receive(("round", "state", "error", "ok", "final"), request)
                if answer["type"] == "error" and answer.get("id") in (rid, None):
                    break
