"""Batched engines: the reference batched decoder with one planted bug each (docs/contract.md, "Batches").

Each member is ``BatchSpecDecoder`` (or its slot pool) with one change, in the shape of a public
report: a zero-draft row that reads the state of before the previous round (vLLM #52942 /
#40738), padding written into the recurrent state (vLLM #55178), a freed slot not cleared
(vLLM #43559, A, B, A), a row's rollback applied to its neighbour's slot, a preempted request
resumed from a stale snapshot (vLLM #49620), a verify forward whose logits move with the batch size
(vLLM RFC #54506 / #41758), unseeded requests replaying one default stream (TensorRT-LLM #19487),
a seed ignored beside an unseeded neighbour (vLLM #51226 / #9441), every row sampled with the batch's
first row's temperature (a per-row parameter broadcast from row 0). ``BatchZooEngine`` is their control; the correct
variants batch differently (replay rollback, a FIFO free list with fewer rows a step than slots).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from specproof.conformance.zoo._targets import small_reference
from specproof.contract import BatchRequest, RequestOutput, Step
from specproof.engine import (
    BatchForward,
    BatchSpecDecoder,
    NgramDrafter,
    ReferenceSlotPool,
    ReferenceSnapshot,
    SwappedSlot,
)

__all__ = [
    "BatchFifoTwoRows",
    "BatchOneRngStream",
    "BatchPadsRecurrentState",
    "BatchRecomputeOnly",
    "BatchReplayEngine",
    "BatchRetriesRejectedRow",
    "BatchRollbackWrongSlot",
    "BatchSeedIgnoredBesideUnseeded",
    "BatchSlotNotCleared",
    "BatchStaleResume",
    "BatchStaleZeroDraft",
    "BatchTemperatureFromFirstRow",
    "BatchVerifyDependsOnBatchSize",
    "BatchZooEngine",
]

SLOTS = 3


class BatchZooEngine(BatchSpecDecoder):
    """The control: the reference batched decoder on the zoo's small model, 3 slots, checkpoint rollback."""

    pool_class: type[ReferenceSlotPool] = ReferenceSlotPool
    rollback_kind = "checkpoint"
    batch_rows: int | None = None

    def __init__(self) -> None:
        pool = self.pool_class(small_reference(), slots=SLOTS)
        super().__init__(pool, NgramDrafter(), k=4, rollback=self.rollback_kind, max_batch=self.batch_rows)  # type: ignore[arg-type]


class BatchReplayEngine(BatchZooEngine):
    """Correct, differently: replay rollback (restore the slot's snapshot, re-feed the kept tokens)."""

    rollback_kind = "replay"


class BatchRecomputeOnly(BatchReplayEngine):
    """Correct, differently: preemption by recompute only (the one mode it declares), replay rollback."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_capabilities = attrs.evolve(self.batch_capabilities, preemption=("recompute",))


class _FifoPool(ReferenceSlotPool):
    """A free list that hands out the slot freed longest ago (a queue, not a stack)."""

    def acquire(self) -> int:
        if self._free:
            self._free.insert(0, self._free.pop())  # the oldest free slot to the end, where acquire pops
        return super().acquire()


class BatchFifoTwoRows(BatchZooEngine):
    """Correct, differently: two rows per verify step for three slots (the third waits holding its slot)
    and a FIFO free list (another batching policy)."""

    pool_class = _FifoPool
    batch_rows = 2


class BatchStaleZeroDraft(BatchZooEngine):
    """A zero-draft row right after a round that accepted drafts verifies from the recurrent state of
    before that round (a stale state index, vLLM #52942 / #40738)."""

    def _prepare(self, req: Any) -> Any:
        previous = req.before  # the slot's state at the start of the previous round
        row = super()._prepare(req)
        if row is not None and not row.draft and req.last_accepted > 0 and isinstance(previous, ReferenceSnapshot):
            device = self.pool.device(req.slot)
            live = device.snapshot()
            device.restore(attrs.evolve(live, conv_state=previous.conv_state, rec_state=previous.rec_state))
        return row


class _PaddingPool(ReferenceSlotPool):
    """Feeds each row padded to the step's width and keeps the state after the padding."""

    def _row_forward(self, slot, tokens, *, width, checkpoints, cks):  # type: ignore[no-untyped-def, override]
        device = self.device(slot)
        n = len(tokens)
        pad = [0] * (width - n)
        if not pad:
            return super()._row_forward(slot, tokens, width=width, checkpoints=checkpoints, cks=cks)
        base = device.processed
        logits, row_cks = device.forward_with_checkpoints([*tokens, *pad])
        # the KV length is cut back to the valid tokens, the recurrent state is the padded end's
        last = row_cks[-1]
        assert isinstance(last, ReferenceSnapshot)
        device.restore(attrs.evolve(last, processed=base + n))
        if checkpoints:
            cks.append(tuple(row_cks[:n]))
        return logits[:n]


class BatchPadsRecurrentState(BatchZooEngine):
    """Padded positions of a short row write the conv and recurrent state (vLLM #55178)."""

    pool_class = _PaddingPool


class _UnclearedPool(ReferenceSlotPool):
    """Freeing a slot empties its KV length but keeps its conv and recurrent state."""

    def clear(self, slot: int) -> None:
        device = self._devices[slot]
        device.restore(attrs.evolve(device.snapshot(), processed=0))


class BatchSlotNotCleared(BatchZooEngine):
    """A freed slot is handed to the next request with the last one's recurrent state (A, B, A: vLLM #43559)."""

    pool_class = _UnclearedPool


class BatchRollbackWrongSlot(BatchZooEngine):
    """A row's rollback is applied to the next row's slot (a row index off by one)."""

    rollback_kind = "replay"

    def _verify_round(self, batch: list[Any]) -> Any:
        self._round_rows = batch
        return super()._verify_round(batch)

    def _roll_back(self, row: Any, keep: int, checkpoints: tuple[object, ...] | None, b: int) -> None:
        rows = self._round_rows
        at = rows.index(row.req)
        if at + 1 >= len(rows) or keep >= len(row.fed):  # the last row (or a row that keeps all) is right
            super()._roll_back(row, keep, checkpoints, b)
            return
        victim = rows[at + 1]  # not settled yet: it still holds its slot
        device = self.pool.device(victim.slot)
        device.restore(victim.before)
        device.forward(row.fed[:keep])


class BatchRetriesRejectedRow(BatchZooEngine):
    """A row whose first draft token is rejected beside other rows is rolled back whole and retried next
    step: that round commits nothing for it (llama.cpp #28061 looped on replayed tokens)."""

    def _verify_round(self, batch: list[Any]) -> Any:
        self._width = len(batch)
        return super()._verify_round(batch)

    def _settle(self, row: Any, b: int, forward: Any) -> Any:
        if self._width > 1 and row.draft and int(np.argmax(forward.row(b)[0])) != row.draft[0]:
            req = row.req
            self.pool.device(req.slot).restore(req.before)
            base = len(req.ctx) - 1
            step = Step(base=base, draft=row.draft, argmax=[], accepted=[], processed=base)
            return RequestOutput(request_id=req.id, step=step, new_tokens=(), slot=req.slot)
        return super()._settle(row, b, forward)


class BatchStaleResume(BatchZooEngine):
    """A request preempted by snapshot resumes with the recurrent state saved at its last round's start."""

    def _evict(self, req: Any) -> SwappedSlot:
        swapped = super()._evict(req)
        before = req.before
        if not isinstance(before, ReferenceSnapshot):
            return swapped
        stale = attrs.evolve(swapped.saved, conv_state=before.conv_state, rec_state=before.rec_state)
        return attrs.evolve(swapped, saved=stale)


class _BatchSizePool(ReferenceSlotPool):
    """A verify step of more than one row adds a batch-size-dependent term to every logit (another
    kernel or reduction order per batch size), half a logit per extra row: beyond any tie tolerance."""

    def forward_batch(self, rows, *, checkpoints):  # type: ignore[no-untyped-def, override]
        out: BatchForward = super().forward_batch(rows, checkpoints=checkpoints)
        if len(rows) > 1:
            drift = 0.5 * (len(rows) - 1) * np.cos(np.arange(self.vocab_size) * 1.3)
            out.logits[out.mask] += drift.astype(out.logits.dtype)
        return out


class BatchVerifyDependsOnBatchSize(BatchZooEngine):
    """A row verified beside others gets other logits than verified alone, by more than the tie
    tolerance, so its greedy tokens change with the batch size (vLLM RFC #54506 / #41758)."""

    pool_class = _BatchSizePool


class BatchOneRngStream(BatchZooEngine):
    """Every request without a seed samples from the engine's one default stream, started afresh
    (TensorRT-LLM #19487): two unseeded requests with one prompt emit the same tokens."""

    def add_request(self, request: BatchRequest) -> None:
        super().add_request(request)
        req = self._requests[request.request_id]
        if req.sampler is not None and req.sampler.params.seed is None:
            req.sampler = attrs.evolve(req.sampler, rng=np.random.default_rng(0))


class BatchSeedIgnoredBesideUnseeded(BatchZooEngine):
    """A round whose batch holds an unseeded sampled request draws every row from the engine's one
    generator, a seeded row's own seed ignored (vLLM #51226 / #9441)."""

    def __init__(self) -> None:
        super().__init__()
        self._engine_rng = np.random.default_rng()

    def _verify_round(self, batch: list[Any]) -> Any:
        if not any(r.sampler is not None and r.sampler.params.seed is None for r in batch):
            return super()._verify_round(batch)
        own = {r.id: r.sampler for r in batch}
        for r in batch:
            if r.sampler is not None:
                r.sampler = attrs.evolve(r.sampler, rng=self._engine_rng)
        try:
            return super()._verify_round(batch)
        finally:
            for r in batch:
                r.sampler = own[r.id]


class BatchTemperatureFromFirstRow(BatchZooEngine):
    """Every sampled row of a verify step is judged with the first row's temperature (a per-row parameter
    broadcast from row 0): beside a greedy first row (temperature 0) the sampled rows are verified and
    drawn greedily, and their tokens no longer follow ``p``."""

    def _verify_round(self, batch: list[Any]) -> Any:
        first = batch[0].sampler if batch else None
        own = {r.id: r.sampler for r in batch}
        for r in batch:
            if r.sampler is not None:
                r.sampler = (
                    None
                    if first is None
                    else attrs.evolve(
                        r.sampler, params=attrs.evolve(r.sampler.params, temperature=first.params.temperature)
                    )
                )
        try:
            return super()._verify_round(batch)
        finally:
            for r in batch:
                r.sampler = own[r.id]
