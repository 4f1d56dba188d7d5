"""The batched speculative decoder: many requests, one verify step per round (docs/contract.md, "Batches").

A step-level scheduler over a slot pool (``ReferenceSlotPool``): every ``step`` admits queued
and preempted requests into free slots (prefill, or restore of a swapped-out slot), asks each
running request's own drafter for its draft, verifies every row in one ``forward_batch`` (rows of
different lengths, padded with a mask), then accepts and rolls back each row in its own slot.

The acceptance rules are the single-request decoder's own (``greedy_accept``, ``sampled_accept``),
called, not copied; so is the per-request sampler and its seeding. Each row's round is the round
its solo ``SpecDecoder`` run would make: the same draft (the drafter sees the same context), the
same forward on its own slot, the same verdict, the same rollback. A request's ``decode`` parameters
get processors of its own (``processors_class``), applied to its row only, as ``SpecDecoder`` applies
them (docs/contract.md, "Decode state").
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Literal

import numpy as np

from specproof.contract import (
    DECODE_FEATURES,
    PREEMPTION_MODES,
    BatchCapabilities,
    BatchRequest,
    DecodeParams,
    Drafter,
    Generation,
    RequestOutput,
    Step,
    StopReason,
    Target,
    run_alone,
)
from specproof.contract.errors import InvalidSettingError, SpecproofError
from specproof.contract.sampling import SAMPLING_SCHEMES, SamplingParams
from specproof.contract.validation import int_at_least
from specproof.engine._batch_requests import (
    BatchRow,
    RequestState,
    abort_error,
    accept_row,
    check_batch_drafter,
    check_mask,
    new_request_state,
    propose,
    record_round,
    result_of,
    scheduled,
    settle_row,
    stop_after_round,
)
from specproof.engine._decoder import (
    ROLLBACK_STRATEGIES,
)
from specproof.engine._processors import RequestProcessors
from specproof.engine.conventions import check_logits, component_name
from specproof.engine.targets._reference_batch import BatchForward, ReferenceSlotPool, SwappedSlot

__all__ = ["BatchSpecDecoder"]


_FEATURES = tuple(f for f in DECODE_FEATURES if f != "prompt_logprobs")  # a solo SpecDecoder call's only


class BatchSpecDecoder:
    """Lossless speculative decoding of many requests at once over a ``ReferenceSlotPool``.

    ``drafter``: the engine's drafter for requests that bring none; ``k``, ``rollback`` and
    ``scheme`` as ``SpecDecoder``; ``max_batch``: rows per verify step (the pool's ``slots`` bound
    how many requests hold state at once). Implements ``BatchEngine`` with every capability.
    """

    decode_features: tuple[str, ...] = _FEATURES
    batch_decode_features: tuple[str, ...] = _FEATURES  # batch requests' ``decode`` too, per request
    processors_class: type[RequestProcessors] = RequestProcessors

    def __init__(
        self,
        pool: ReferenceSlotPool,
        drafter: Drafter,
        *,
        k: int = 4,
        rollback: Literal["checkpoint", "replay"] = "checkpoint",
        scheme: Literal["rejection", "match"] = "rejection",
        max_batch: int | None = None,
    ) -> None:
        self.k = int_at_least(k, name="k", minimum=0, where="BatchSpecDecoder")
        if rollback not in ROLLBACK_STRATEGIES:
            raise InvalidSettingError(f"BatchSpecDecoder rollback={rollback!r} is not one of {ROLLBACK_STRATEGIES}")
        if scheme not in SAMPLING_SCHEMES:
            raise InvalidSettingError(f"BatchSpecDecoder scheme={scheme!r} is not one of {SAMPLING_SCHEMES}")
        if not callable(getattr(pool, "forward_batch", None)):
            raise InvalidSettingError(f"BatchSpecDecoder needs a slot pool with forward_batch, got {pool!r}")
        check_batch_drafter(drafter, where="drafter")
        self.pool = pool
        self.drafter = drafter
        self.rollback = rollback
        self.scheme = scheme
        batch = pool.slots if max_batch is None else max_batch
        self.max_batch = int_at_least(batch, name="max_batch", minimum=1, where="BatchSpecDecoder")
        self.batch_capabilities = BatchCapabilities(
            max_batch=self.max_batch,
            slots=pool.slots,
            continuous_arrivals=True,
            preemption=PREEMPTION_MODES,
            schedulable=True,
            per_slot_state=True,
            batch_invariant_seeding=True,
        )
        self.name = f"specproof.BatchSpecDecoder(k={self.k}, rollback={rollback}, slots={pool.slots})"
        self._requests: dict[str, RequestState] = {}
        self._order: list[str] = []  # arrival order: admission and batch order follow it
        self._solo_ids = itertools.count()
        self.seeded = True  # docs/contract.md, "Sampling": one seed gives one output

    def __repr__(self) -> str:
        return (
            f"BatchSpecDecoder(pool={self.pool!r}, drafter={component_name(self.drafter)}, k={self.k}, "
            f"rollback={self.rollback!r}, scheme={self.scheme!r}, max_batch={self.max_batch})"
        )

    # ------------------------------------------------------------------ the BatchEngine API

    def add_request(self, request: BatchRequest) -> None:
        """Queue ``request``; it is admitted into a free slot at the next ``step`` that schedules it."""
        if not isinstance(request, BatchRequest):
            raise InvalidSettingError(f"add_request takes a BatchRequest, got {type(request).__name__}")
        if request.request_id in self._requests:
            raise InvalidSettingError(f"request_id {request.request_id!r} is already in the engine")
        drafter = self.drafter if request.drafter is None else request.drafter
        self._requests[request.request_id] = new_request_state(
            request,
            drafter,
            vocab_size=self.pool.vocab_size,
            max_context=self.pool.max_context,
            k=self.k,
            scheme=self.scheme,
            processors_class=self.processors_class,
        )
        self._order.append(request.request_id)

    @property
    def vocab_size(self) -> int:
        return self.pool.vocab_size

    @property
    def oracle(self) -> Target:
        """The model the pool's slots copy (never decoded on): the suite's oracle, as for any engine."""
        return self.pool.template

    def reset(self) -> None:
        """Cancel every request (their slots are freed)."""
        for request_id in list(self._order):
            self.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def slot_state(self, request_id: str) -> Mapping[str, np.ndarray] | None:
        """The running request's slot state (KV prefix, conv, recurrent); None while it holds no slot."""
        req = self._get(request_id)
        return None if req.slot is None else self.pool.state_arrays(req.slot)

    def abort_request(self, request_id: str) -> Generation:
        """Cancel ``request_id``, free its slot and return what it had emitted (stop reason ``error``)."""
        req = self._get(request_id)
        self._free(req)
        return result_of(req, "error")

    def preempt(self, request_id: str, *, mode: str) -> None:
        """Evict a running request: ``snapshot`` swaps its slot memory out; ``recompute`` drops it and
        re-prefills its context on resume. It resumes at the next step that schedules it."""
        if mode not in PREEMPTION_MODES:
            raise InvalidSettingError(f"preempt mode={mode!r} is not one of {PREEMPTION_MODES}")
        req = self._get(request_id)
        if req.phase != "running" or req.slot is None:
            raise InvalidSettingError(f"request {request_id!r} is {req.phase}, not running: nothing to preempt")
        if mode == "snapshot":
            req.swapped = self._evict(req)
        else:
            self.pool.release(req.slot)
        req.slot = None
        req.phase = "preempted"

    def step(self, *, only: Collection[str] | None = None) -> list[RequestOutput]:
        """One verify round for the scheduled running requests (admitting waiting ones first)."""
        wanted = scheduled(self._requests, self._order, only)
        outputs: list[RequestOutput] = []
        for req in wanted:
            if req.phase != "running" and self.pool.free_slots:
                done = self._admit(req)
                if done is not None:
                    outputs.append(done)
        batch = [r for r in wanted if r.phase == "running" and r.id in self._requests][: self.max_batch]
        if batch:
            outputs.extend(self._verify_round(batch))
        return outputs

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        sampling: SamplingParams | None = None,
        decode: DecodeParams | None = None,
    ) -> Generation:
        """The single-request ``Engine`` call: a batch of one (so the engine is certifiable as any engine)."""
        if not self.pool.free_slots:
            raise InvalidSettingError(
                "generate: every slot is held by a request in flight; step those to the end first"
            )
        request = BatchRequest(
            request_id=f"generate-{next(self._solo_ids)}",
            prompt=tuple(prompt),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id,
            sampling=sampling,
            decode=decode,
        )
        # a request commits at least one token a round: max_new_tokens + 2 steps always suffice
        return run_alone(self, request, max_steps=request.max_new_tokens + 2)

    # ------------------------------------------------------------------ scheduling

    def _get(self, request_id: str) -> RequestState:
        try:
            return self._requests[request_id]
        except KeyError:
            raise InvalidSettingError(f"no request {request_id!r} in the engine") from None

    def _admit(self, req: RequestState) -> RequestOutput | None:
        """Give ``req`` a slot: restore its swapped memory, or prefill its context but the last token.

        A request with nothing left to do finishes here (returns its output)."""
        if req.phase == "queued" and req.request.max_new_tokens == 0:
            return self._finish(req, "max_new_tokens", step=None, new=[])
        if req.swapped is not None:
            req.slot = self._resume(req.swapped)
            req.swapped = None
        else:
            req.slot = self.pool.acquire()
            if req.phase == "queued":
                reset = getattr(req.drafter, "reset", None)
                if callable(reset) and getattr(req.drafter, "history_dependent", False) is not True:
                    reset()
            prefix = req.ctx[:-1]
            if prefix:
                logits = self.pool.device(req.slot).forward(prefix)
                check_logits(logits, rows=len(prefix), vocab_size=self.pool.vocab_size, target="slot", round_index=None)
                req.counter.prefill += 1
        req.phase = "running"
        return None

    def _evict(self, req: RequestState) -> SwappedSlot:
        assert req.slot is not None
        return self.pool.evict(req.slot)

    def _resume(self, swapped: SwappedSlot) -> int:
        return self.pool.resume(swapped)

    def _free(self, req: RequestState) -> None:
        if req.slot is not None:
            self.pool.release(req.slot)
            req.slot = None
        req.swapped = None
        del self._requests[req.id]
        self._order.remove(req.id)

    # ------------------------------------------------------------------ one round

    def _verify_round(self, batch: list[RequestState]) -> list[RequestOutput]:
        rows: list[BatchRow] = []
        outputs: list[RequestOutput] = []
        for req in batch:
            row = self._prepare(req)
            if row is None:
                outputs.append(self._finish(req, "context_full", step=None, new=[]))
            else:
                rows.append(row)
        if not rows:
            return outputs
        try:
            forward = self._forward(rows)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise abort_error(rows, exc, self.pool) from exc
        for b, row in enumerate(rows):
            outputs.append(self._settle(row, b, forward))
        return outputs

    def _prepare(self, req: RequestState) -> BatchRow | None:
        """The row ``req`` feeds this round (None when its context is full)."""
        assert req.slot is not None
        device = self.pool.device(req.slot)
        room = self.pool.max_context - device.processed
        if room < 1:
            return None
        remaining = req.request.max_new_tokens - len(req.out)
        k_eff = min(self.k, remaining - 1, room - 1)
        self._before_round(req)
        draft, q = propose(req, k_eff, vocab=self.pool.vocab_size)
        return BatchRow(req=req, draft=draft, q=q, fed=[req.ctx[-1], *draft], remaining=remaining)

    def _before_round(self, req: RequestState) -> None:
        assert req.slot is not None
        req.before = self.pool.device(req.slot).snapshot()

    def _forward(self, rows: list[BatchRow]) -> BatchForward:
        pairs = [(row.req.slot, row.fed) for row in rows]
        forward = self.pool.forward_batch(pairs, checkpoints=self.rollback == "checkpoint")  # type: ignore[arg-type]
        check_mask(forward, rows)
        return forward

    def _settle(self, row: BatchRow, b: int, forward: BatchForward) -> RequestOutput:
        """Accept, roll back and record row ``b``; finish its request when it stopped."""
        req = row.req
        logits = check_logits(
            forward.row(b),
            rows=len(row.fed),
            vocab_size=self.pool.vocab_size,
            target="slot",
            round_index=len(req.steps),
        )
        verdict = accept_row(row, logits)
        checkpoints = None if forward.checkpoints is None else forward.checkpoints[b]
        self._roll_back(row, verdict.keep, checkpoints, b)
        assert req.slot is not None
        base = len(req.ctx) - 1
        processed = self.pool.device(req.slot).processed
        if processed != base + verdict.keep:
            raise SpecproofError(
                f"request {req.id!r}'s slot holds {processed} tokens after round {len(req.steps)}, "
                f"expected {base + verdict.keep}"
            )
        verdict = settle_row(req, verdict, row.draft)
        step = record_round(req, row.draft, verdict, base=base, processed=processed)
        slot = req.slot
        stop = stop_after_round(req, verdict)
        if stop is not None:
            return self._finish(req, stop, step=step, new=verdict.emitted, slot=slot)
        return RequestOutput(request_id=req.id, step=step, new_tokens=verdict.emitted, slot=slot)

    def _roll_back(self, row: BatchRow, keep: int, checkpoints: tuple[object, ...] | None, b: int) -> None:
        """Bring the row's slot back to ``keep`` fed tokens when a draft token was rejected."""
        if keep >= len(row.fed):
            return
        req = row.req
        assert req.slot is not None
        device = self.pool.device(req.slot)
        if checkpoints is not None:
            device.restore(checkpoints[keep - 1])
            return
        device.restore(req.before)
        device.forward(row.fed[:keep])
        req.counter.replay += 1

    def _finish(
        self, req: RequestState, stop: StopReason, *, step: Step | None, new: list[int], slot: int | None = None
    ) -> RequestOutput:
        generation = result_of(req, stop)
        self._free(req)
        return RequestOutput(request_id=req.id, step=step, new_tokens=new, finished=generation, slot=slot)
