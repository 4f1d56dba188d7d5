"""One request inside the batched decoder: its record, its row of a verify step, and the per-request
parts of a round (proposal, record, result) that do not depend on the other rows."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal

import attrs
import numpy as np

from specproof.contract import (
    BatchRequest,
    Drafter,
    Generation,
    Step,
    StopReason,
)
from specproof.contract.errors import DecodeError, InvalidSettingError, SpecproofError, TokenRangeError
from specproof.engine._decoder import ContextView, Verdict, _Sampler, _StatsCounter, greedy_accept, sampled_accept
from specproof.engine._processors import RequestProcessors
from specproof.engine.conventions import check_draft, check_prompt, check_proposal_rows, component_name
from specproof.engine.targets._reference_batch import BatchForward, ReferenceSlotPool, SwappedSlot

__all__ = [
    "BatchRow",
    "RequestState",
    "abort_error",
    "accept_row",
    "check_batch_drafter",
    "check_mask",
    "new_request_state",
    "propose",
    "record_round",
    "result_of",
    "scheduled",
    "settle_row",
    "stop_after_round",
]

Phase = Literal["queued", "running", "preempted"]


@attrs.define(eq=False)
class RequestState:
    """One request's life in the engine: its context, output, records and where its state is."""

    request: BatchRequest
    drafter: Drafter
    ctx: list[int]
    sampler: _Sampler | None
    counter: _StatsCounter
    view: ContextView = attrs.field(init=False)
    out: list[int] = attrs.Factory(list)
    steps: list[Step] = attrs.Factory(list)
    phase: Phase = "queued"
    slot: int | None = None
    swapped: SwappedSlot | None = None
    before: object = None  # the slot's state at the start of this round (replay rollback, abort)
    last_accepted: int = -1  # the previous round's accepted draft prefix (-1: no round yet)
    processors: RequestProcessors | None = None  # the request's own decode state (None: no DecodeParams)

    def __attrs_post_init__(self) -> None:
        self.view = ContextView(self.ctx)

    @property
    def id(self) -> str:
        return self.request.request_id


@attrs.frozen
class BatchRow:
    """One row of a verify step: the request, its draft and ``q`` rows, and what it feeds."""

    req: RequestState
    draft: list[int]
    q: np.ndarray
    fed: list[int]
    remaining: int


def new_request_state(
    request: BatchRequest,
    drafter: Drafter,
    *,
    vocab_size: int,
    max_context: int,
    k: int,
    scheme: str,
    processors_class: type[RequestProcessors] = RequestProcessors,
) -> RequestState:
    """A queued request's state, after checking its prompt, EOS, drafter and decode parameters against the
    engine; ``processors_class`` makes its processors (one per request: no state shared with a neighbour)."""
    ctx = check_prompt(request.prompt, vocab_size=vocab_size, max_context=max_context)
    eos = request.eos_token_id
    if eos is not None and not eos < vocab_size:
        raise TokenRangeError(f"request {request.request_id!r}: eos_token_id={eos} is not below the vocabulary")
    check_batch_drafter(drafter, where=f"request {request.request_id!r} drafter")
    sampling = request.sampling
    sampler = (
        None if sampling is None else _Sampler(params=sampling, rng=np.random.default_rng(sampling.seed), scheme=scheme)  # type: ignore[arg-type]
    )
    processors = processors_class.for_call(request.decode, ctx, eos, vocab_size)
    return RequestState(
        request=request, drafter=drafter, ctx=ctx, sampler=sampler, counter=_StatsCounter(k), processors=processors
    )


def check_mask(forward: BatchForward, rows: Sequence[BatchRow]) -> None:
    """Each row's mask covers exactly the tokens it fed (a pool that masks wrongly is named, not trusted)."""
    for b, row in enumerate(rows):
        if int(forward.mask[b].sum()) != len(row.fed):
            raise SpecproofError(
                f"the verify step's mask holds {int(forward.mask[b].sum())} positions for request "
                f"{row.req.id!r}'s row of {len(row.fed)} tokens"
            )


def scheduled(
    requests: Mapping[str, RequestState], order: Sequence[str], only: Collection[str] | None
) -> list[RequestState]:
    """The requests a step schedules, in arrival order: all, or those named in ``only``."""
    if only is None:
        return [requests[i] for i in order]
    if isinstance(only, str):
        raise InvalidSettingError(f"step(only=) takes a collection of request ids, not the string {only!r}")
    unknown = [i for i in only if i not in requests]
    if unknown:
        raise InvalidSettingError(f"step(only=): no request {unknown[0]!r} in the engine")
    picked = set(only)
    return [requests[i] for i in order if i in picked]


def check_batch_drafter(drafter: object, *, where: str) -> None:
    """A drafter the batched decoder can call: ``propose`` and no feature layers (it passes no features)."""
    if not callable(getattr(drafter, "propose", None)):
        raise InvalidSettingError(f"{where} {component_name(drafter)} has no propose(context, k) method")
    if getattr(drafter, "feature_layers", None) is not None:
        raise InvalidSettingError(
            f"{where} {component_name(drafter)} reads target features; the batched decoder does not pass them"
        )


def propose(req: RequestState, k_eff: int, *, vocab: int) -> tuple[list[int], np.ndarray]:
    """The request's own drafter's checked proposal of at most ``k_eff`` tokens and its ``q`` rows
    (one-hot for a deterministic drafter or a greedy request), as ``SpecDecoder`` asks for it."""
    if k_eff <= 0:
        return [], np.zeros((0, vocab))
    name = component_name(req.drafter)
    sampled = getattr(req.drafter, "propose_sampled", None)
    q: np.ndarray | None = None
    round_index = len(req.steps)
    if req.sampler is not None and callable(sampled):
        proposal = sampled(req.view, k_eff, sampling=req.sampler.params, rng=req.sampler.rng)
        raw, q = proposal.tokens, proposal.q
    else:
        raw = req.drafter.propose(req.view, k_eff)
    draft = check_draft(raw, k=k_eff, vocab_size=vocab, drafter=name, round_index=round_index)
    if q is None:
        q = np.zeros((len(draft), vocab))
        q[np.arange(len(draft)), draft] = 1.0
    else:
        q = check_proposal_rows(q, draft, vocab_size=vocab, drafter=name, round_index=round_index)
    return draft, q


def record_round(req: RequestState, draft: list[int], verdict: Verdict, *, base: int, processed: int) -> Step:
    """Count the round in the request's stats, extend its context and output, and return its ``Step``."""
    j = verdict.accepted_prefix
    req.counter.count_round(len(draft), j)
    req.counter.verify += 1
    req.ctx.extend(verdict.emitted)
    req.out.extend(verdict.emitted)
    req.last_accepted = j
    step = Step(base=base, draft=draft, argmax=verdict.argmax, accepted=verdict.accepted, processed=processed)
    req.steps.append(step)
    return step


def result_of(req: RequestState, stop: StopReason) -> Generation:
    """The request's ``Generation`` so far, as its solo ``generate`` would return it."""
    req.counter.emitted = len(req.out)
    return Generation(tokens=req.out, stop_reason=stop, steps=tuple(req.steps), stats=req.counter.freeze())


def abort_error(rows: Sequence[BatchRow], exc: BaseException, pool: ReferenceSlotPool) -> DecodeError:
    """The ``DecodeError`` for a failed verify step, after putting every row's slot back as before it
    (its snapshot taken before the step)."""
    restored = "every row's slot was restored to its state before the round"
    for row in rows:
        try:
            assert row.req.slot is not None
            pool.device(row.req.slot).restore(row.req.before)
        except Exception as restore_exc:  # a slot broken beyond repair: say so
            restored = f"restoring request {row.req.id!r}'s slot failed too ({restore_exc!r})"
    return DecodeError(
        f"a verify step of {len(rows)} rows failed: {exc} ({type(exc).__name__}); {restored}",
        partial=Generation(tokens=(), stop_reason="error"),
        round_index=min(len(row.req.steps) for row in rows),
    )


def accept_row(row: BatchRow, logits: np.ndarray) -> Verdict:
    """``row``'s verdict: its logits processed by the request's own processors first (each row with the state
    advanced through the draft before it; they then hold the call's EOS ids), then the greedy or sampled rule."""
    req = row.req
    eos = req.request.eos_token_id
    if req.processors is not None:
        logits, eos = req.processors.verify_rows(logits, row.draft), None
    if req.sampler is None:
        return greedy_accept(row.draft, logits, remaining=row.remaining, eos=eos)
    return sampled_accept(row.draft, row.q, logits, req.sampler, remaining=row.remaining, eos=eos)


def settle_row(req: RequestState, verdict: Verdict, draft: Sequence[int]) -> Verdict:
    """``verdict`` cut at the request's first stop, its processors committed to what is emitted (no decode
    parameters: as is)."""
    if req.processors is None:
        return verdict
    return attrs.evolve(verdict, emitted=req.processors.settle(verdict.emitted, draft=draft))


def stop_after_round(req: RequestState, verdict: Verdict) -> StopReason | None:
    """Why the request ends after this round (its round recorded), or None: a decode stop, its EOS, its budget."""
    if req.processors is not None and req.processors.finished is not None:
        return req.processors.finished
    eos = req.request.eos_token_id
    if eos is not None and req.processors is None and verdict.emitted[-1] == eos:
        return "eos"
    if len(req.out) >= req.request.max_new_tokens:
        return "max_new_tokens"
    return None
