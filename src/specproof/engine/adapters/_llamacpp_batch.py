"""llama.cpp's parallel sequences as a ``BatchEngine`` (docs/contract.md, "Batches"; docs/real-engines.md,
"llama.cpp in batches").

Each request holds one llama.cpp sequence id (a slot: the context is made with ``n_seq_max`` slots, so
a hybrid model's recurrent memory has one cell per slot). One ``step`` is one ``llama_decode`` of a
``llama_batch`` with a row per scheduled request: the tokens its sequence does not hold yet (the whole
prompt on admission: prefill and verify rows mixed in one batch), its last token and its draft,
logits on the last ``1 + len(draft)`` positions. Each row is accepted greedily on its own logits and
its rejected tail removed with ``llama_memory_seq_rm`` (on a hybrid model llama.cpp rolls the recurrent
state back through its ``n_rs_seq`` snapshots; a refused removal is an error naming ``n_rs_seq``, as in
the single-request path). This is what llama.cpp's own server does with ``--parallel`` slots, without
its HTTP layer, through llama-cpp-python's low-level bindings.

Preemption: ``recompute`` removes the sequence (``llama_memory_seq_rm(seq, -1, -1)``, which never
fails) and re-prefills its context on resume; ``snapshot`` saves the sequence's memory
(``llama_state_seq_get_data``, what the server's slot save uses) and restores it into whatever slot
is free on resume (``llama_state_seq_set_data``). Greedy requests only: llama.cpp's sampler chain is
one per context, so a sampled request in a batch is refused, not approximated.
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection, Sequence
from typing import Any

import attrs
import numpy as np

from specproof.contract import (
    PREEMPTION_MODES,
    BatchCapabilities,
    BatchRequest,
    Generation,
    RequestOutput,
    Step,
    StopReason,
)
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.engine._batch_requests import (
    RequestState,
    new_request_state,
    propose,
    record_round,
    result_of,
    scheduled,
)
from specproof.engine._decoder import greedy_accept

__all__ = ["LlamaCppBatch", "LookupDrafter"]


class LookupDrafter:
    """The engine's own drafter for a request that brings none: llama-cpp-python's prompt lookup
    (``LlamaPromptLookupDecoding``) on the request's context; ``inner=None`` drafts nothing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if self.inner is None or k <= 0:
            return []
        draft = self.inner(np.asarray(list(context), dtype=np.intc))
        return [int(t) for t in draft[:k]]


_Entry = tuple[int, int, int, bool]  # (token, position, sequence id, logits wanted)


@attrs.frozen
class _Row:
    """One request's row of a step: what its sequence is fed from ``start`` and the draft at its end."""

    req: RequestState
    start: int  # the position of the first fed token (the tokens its sequence already holds)
    fed: list[int]
    draft: list[int]
    remaining: int


class LlamaCppBatch:
    """The ``BatchEngine`` side of a ``LlamaCppEngine`` with ``parallel=N`` (N sequence slots).

    ``llm``: the engine's ``Llama`` (its context made with ``n_seq_max = slots``); ``k``: the longest
    draft a row verifies (0: plain batched greedy); ``drafter``: the engine's own, for requests without
    one; ``settings``: named in errors. ``LlamaCppEngine`` delegates its ``BatchEngine`` methods here.
    """

    def __init__(
        self,
        llm: Any,
        *,
        low: Any,
        slots: int,
        k: int,
        drafter: LookupDrafter,
        vocab_size: int,
        max_context: int,
        settings: str,
        n_rs_seq: int,
    ) -> None:
        self.llm = llm
        self.low = low  # llama_cpp.llama_cpp: the ctypes bindings
        self.k = k
        self.drafter = drafter
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.settings = settings
        self.n_rs_seq = n_rs_seq
        self.slots = slots
        self.capabilities = BatchCapabilities(
            max_batch=slots,
            slots=slots,
            continuous_arrivals=True,
            preemption=PREEMPTION_MODES,
            schedulable=True,
            per_slot_state=False,  # llama.cpp's per-sequence memory is not readable as arrays
            batch_invariant_seeding=False,
            sampling=False,  # greedy only (one sampler chain per context): add_request refuses sampling
        )
        self.n_batch = int(low.llama_n_batch(llm._ctx.ctx))
        # every row's judged positions fit one decode: parse_llamacpp_spec bounds parallel * (K + 1) by it
        assert slots * (k + 1) <= self.n_batch, (slots, k, self.n_batch)
        self._batch = low.llama_batch_init(self.n_batch, 0, 1)
        self._requests: dict[str, RequestState] = {}
        self._order: list[str] = []
        self._free: list[int] = list(range(slots))
        self._held: dict[str, int] = {}  # tokens of the request's context its sequence holds
        self._saved: dict[str, bytes] = {}  # snapshot-preempted requests' sequence memory

    # ------------------------------------------------------------------ the BatchEngine API

    def add_request(self, request: BatchRequest) -> None:
        """Queue ``request`` (greedy only); it is admitted into a free slot at the next step that schedules it."""
        if not isinstance(request, BatchRequest):
            raise InvalidSettingError(f"add_request takes a BatchRequest, got {type(request).__name__}")
        if request.request_id in self._requests:
            raise InvalidSettingError(f"request_id {request.request_id!r} is already in the engine")
        if request.sampling is not None and not request.sampling.greedy:
            raise InvalidSettingError(
                f"request {request.request_id!r} samples ({request.sampling}): the llamacpp: batch engine decodes "
                "greedy requests only (llama.cpp's sampler chain is one per context); run it alone with generate()"
            )
        if request.decode is not None:  # parameter parity: refused, never dropped
            raise UnsupportedParameterError(
                f"request {request.request_id!r} carries decode parameters: the llamacpp: batch engine runs "
                "llama.cpp's greedy sampler per sequence without them; run it alone with generate(..., decode=)"
            )
        if not self._requests:
            self._clear()  # forget what a generate() call or an earlier batch left in the context
        drafter = self.drafter if request.drafter is None else request.drafter
        state = new_request_state(
            request, drafter, vocab_size=self.vocab_size, max_context=self.max_context, k=self.k, scheme="match"
        )
        self._requests[request.request_id] = state
        self._order.append(request.request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def abort_request(self, request_id: str) -> Generation:
        """Cancel ``request_id``, remove its sequence and return what it had emitted (stop reason ``error``)."""
        req = self._get(request_id)
        self._drop(req)
        return result_of(req, "error")

    def preempt(self, request_id: str, *, mode: str) -> None:
        """Evict a running request: ``snapshot`` saves its sequence's memory first, ``recompute`` re-prefills
        its context on resume. Its slot is free at once."""
        if mode not in PREEMPTION_MODES:
            raise InvalidSettingError(f"preempt mode={mode!r} is not one of {PREEMPTION_MODES}")
        req = self._get(request_id)
        if req.phase != "running" or req.slot is None:
            raise InvalidSettingError(f"request {request_id!r} is {req.phase}, not running: nothing to preempt")
        if mode == "snapshot":
            self._saved[request_id] = self._save(req.slot)
        else:
            self._held[request_id] = 0
        self._release(req)
        req.phase = "preempted"

    def step(self, *, only: Collection[str] | None = None) -> list[RequestOutput]:
        """One ``llama_decode`` for the scheduled running requests (admitting waiting ones first)."""
        wanted = scheduled(self._requests, self._order, only)
        outputs: list[RequestOutput] = []
        for req in wanted:
            if req.phase != "running" and self._free:
                if req.phase == "queued" and req.request.max_new_tokens == 0:
                    outputs.append(self._finish(req, "max_new_tokens", step=None, new=[]))
                else:
                    self._admit(req)
        running = [r for r in wanted if r.phase == "running" and r.id in self._requests][: self.capabilities.max_batch]
        rows: list[_Row] = []
        for req in running:
            row = self._row(req)
            if row is None:
                outputs.append(self._finish(req, "context_full", step=None, new=[]))
            else:
                rows.append(row)
        if rows:
            logits = self._decode(rows)
            outputs.extend(self._settle(row, rows_logits) for row, rows_logits in zip(rows, logits))
        return outputs

    def reset(self) -> None:
        """Cancel every request and clear the context's memory."""
        self._requests.clear()
        self._order.clear()
        self._saved.clear()
        self._clear()

    def close(self) -> None:
        if self._batch is not None:
            self.low.llama_batch_free(self._batch)
            self._batch = None

    # ------------------------------------------------------------------ slots

    def _get(self, request_id: str) -> RequestState:
        try:
            return self._requests[request_id]
        except KeyError:
            raise InvalidSettingError(f"no request {request_id!r} in the engine") from None

    def _memory(self) -> Any:
        return self.low.llama_get_memory(self.llm._ctx.ctx)

    def _clear(self) -> None:
        self.low.llama_memory_clear(self._memory(), True)
        self.llm.reset()  # Llama.generate's own token history: nothing of it is in the memory now
        self._free = list(range(self.slots))
        self._held.clear()

    def _admit(self, req: RequestState) -> None:
        slot = self._free.pop(0)
        saved = self._saved.pop(req.id, None)
        if saved is not None:
            self._restore(saved, slot)
        else:
            self._held[req.id] = 0
            if req.phase == "queued":
                reset = getattr(req.drafter, "reset", None)
                if callable(reset) and getattr(req.drafter, "history_dependent", False) is not True:
                    reset()
        req.slot = slot
        req.phase = "running"

    def _release(self, req: RequestState) -> None:
        if req.slot is not None:
            self.low.llama_memory_seq_rm(self._memory(), req.slot, -1, -1)  # a whole sequence: never refused
            self._free.append(req.slot)
            req.slot = None

    def _drop(self, req: RequestState) -> None:
        self._release(req)
        self._saved.pop(req.id, None)
        self._held.pop(req.id, None)
        del self._requests[req.id]
        self._order.remove(req.id)

    def _save(self, slot: int) -> bytes:
        ctx = self.llm._ctx.ctx
        size = int(self.low.llama_state_seq_get_size(ctx, slot))
        buffer = (ctypes.c_uint8 * size)()
        written = int(self.low.llama_state_seq_get_data(ctx, buffer, size, slot))
        if written == 0:
            raise InvalidSettingError(f"llama.cpp saved nothing of sequence {slot} (llama_state_seq_get_data: 0)")
        return bytes(buffer)[:written]

    def _restore(self, saved: bytes, slot: int) -> None:
        buffer = (ctypes.c_uint8 * len(saved)).from_buffer_copy(saved)
        if int(self.low.llama_state_seq_set_data(self.llm._ctx.ctx, buffer, len(saved), slot)) == 0:
            raise InvalidSettingError(
                f"llama.cpp refused to restore a saved sequence into slot {slot} (llama_state_seq_set_data: 0)"
            )

    # ------------------------------------------------------------------ one round

    def _row(self, req: RequestState) -> _Row | None:
        """The row ``req`` feeds this step (None when its context is full)."""
        base = len(req.ctx) - 1
        room = self.max_context - base
        if room < 1:
            return None
        remaining = req.request.max_new_tokens - len(req.out)
        draft, _ = propose(req, min(self.k, remaining - 1, room - 1), vocab=self.vocab_size)
        start = self._held[req.id]
        return _Row(req=req, start=start, fed=[*req.ctx[start:], *draft], draft=draft, remaining=remaining)

    def _decode(self, rows: list[_Row]) -> list[np.ndarray]:
        """Feed every row (as few ``llama_decode`` calls as ``n_batch`` allows) and return each row's
        logits on its last ``1 + len(draft)`` positions."""
        entries: list[_Entry] = []  # row after row, in the rows' order
        for row in rows:
            assert row.req.slot is not None
            first_out = len(row.fed) - 1 - len(row.draft)  # the last token and the draft are judged
            entries.extend((token, row.start + i, row.req.slot, i >= first_out) for i, token in enumerate(row.fed))
        if len(entries) > self.n_batch:
            # the prefill parts first (n_batch tokens a decode, no logits), then every row's outputs
            heads = [e for e in entries if not e[3]]
            for at in range(0, len(heads), self.n_batch):
                self._decode_one(heads[at : at + self.n_batch])
            entries = [e for e in entries if e[3]]
        self._decode_one(entries)
        ctx = self.llm._ctx.ctx
        n_vocab = int(self.llm.n_vocab())
        out_index = [i for i, e in enumerate(entries) if e[3]]
        logits: list[np.ndarray] = []
        cursor = 0
        for row in rows:
            n = 1 + len(row.draft)
            block = []
            for i in out_index[cursor : cursor + n]:
                pointer = self.low.llama_get_logits_ith(ctx, i)
                block.append(np.ctypeslib.as_array(pointer, shape=(n_vocab,)).astype(np.float64))
            cursor += n
            logits.append(np.stack(block)[:, : self.vocab_size])
        return logits

    def _decode_one(self, entries: list[_Entry]) -> None:
        batch = self._batch
        for i, (token, position, seq, output) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = output
        batch.n_tokens = len(entries)
        code = int(self.low.llama_decode(self.llm._ctx.ctx, batch))
        if code != 0:
            room = " (no room in the KV cache: the sequences together hold more than n_ctx)" if code == 1 else ""
            raise InvalidSettingError(
                f"llama.cpp failed on {self.settings}: llama_decode of a batch of {len(entries)} tokens over "
                f"{len({e[2] for e in entries})} sequence(s) returned {code}{room}"
            )

    def _settle(self, row: _Row, logits: np.ndarray) -> RequestOutput:
        """Accept the row greedily, remove its rejected tail from its sequence, record the round."""
        req = row.req
        eos = req.request.eos_token_id
        verdict = greedy_accept(row.draft, logits, remaining=row.remaining, eos=eos)
        base = len(req.ctx) - 1
        held = base + verdict.keep
        stops = (eos is not None and verdict.emitted[-1] == eos) or len(req.out) + len(verdict.emitted) >= (
            req.request.max_new_tokens
        )
        fed_to = row.start + len(row.fed)  # the sequence holds positions [0, fed_to)
        if held < fed_to and not stops:
            assert req.slot is not None
            if not self.low.llama_memory_seq_rm(self._memory(), req.slot, held, -1):
                text = (
                    f"llama.cpp failed on {self.settings}: it refused to cut sequence {req.slot} (request "
                    f"{req.id!r}) back to position {held} after a rejected draft (llama_memory_seq_rm returned false)"
                )
                if self.n_rs_seq < self.k:
                    text += f"; set n_rs_seq={self.k} (at least the draft length K) to allow the rollback"
                raise InvalidSettingError(text)
        self._held[req.id] = held
        step = record_round(req, row.draft, verdict, base=base, processed=held)
        slot = req.slot
        if eos is not None and verdict.emitted[-1] == eos:
            return self._finish(req, "eos", step=step, new=verdict.emitted, slot=slot)
        if len(req.out) >= req.request.max_new_tokens:
            return self._finish(req, "max_new_tokens", step=step, new=verdict.emitted, slot=slot)
        return RequestOutput(request_id=req.id, step=step, new_tokens=verdict.emitted, slot=slot)

    def _finish(
        self, req: RequestState, stop: StopReason, *, step: Step | None, new: list[int], slot: int | None = None
    ) -> RequestOutput:
        generation = result_of(req, stop)
        self._drop(req)
        return RequestOutput(request_id=req.id, step=step, new_tokens=new, finished=generation, slot=slot)
