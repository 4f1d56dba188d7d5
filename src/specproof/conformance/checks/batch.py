"""The batch checks: each request of a batched engine as that request run alone (docs/contract.md, "Batches").

A ``BatchSchedule`` (``specproof.strategies``) is run on a batched engine by ``run_schedule``;
each check judges one aspect of the run against the suite's own oracle (plain greedy on a fresh
model, and a fresh model fed a request's accepted tokens for slot states), never against the
engine itself. Each returns ``(violations, exercised, note)``; the registry binds them to ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from specproof.contract import (
    BatchCapabilities,
    BatchRequest,
    Generation,
    RequestOutput,
    SamplingParams,
    Violation,
    run_alone,
)
from specproof.contract.compare import states_differ
from specproof.contract.decode_state import plain_decode_with
from specproof.contract.lossless import compare_lossless
from specproof.strategies import BatchSchedule, ScheduledRequest, ScriptedDrafter

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = [
    "BatchSubject",
    "ScheduleRun",
    "check_isolation",
    "check_liveness",
    "check_per_slot_state",
    "check_schedule_invariance",
    "check_slot_reuse",
    "run_schedule",
]

Result = tuple[list[Violation], int, str]
SEEDED = SamplingParams(temperature=0.8)  # the sampling parameters of a schedule's seeded requests


@attrs.frozen(kw_only=True)
class BatchSubject:
    """A batched engine under test and the suite's oracles for it.

    ``make_engine``: a fresh (or reset) engine; ``greedy(prompt, n, eos)``: plain greedy on a fresh
    copy of the model; ``make_reference``: a fresh model whose ``state_arrays`` a slot is compared
    with (None: no white-box state check); ``sampling``: the parameters of sampled requests (None:
    ``SEEDED``); ``seed_alpha``: ``batch.seeds``' false-fail bound for one schedule; ``tally``: the
    run's PIT test that ``batch.sampled-distribution`` accumulates across schedules (None: one per call).
    """

    make_engine: Callable[[], Any]
    greedy: Callable[[Sequence[int], int, int | None], list[int]]
    vocab_size: int
    k: int
    capabilities: BatchCapabilities
    make_reference: Callable[[], Any] | None = None
    tie_tolerance: float = 0.0
    atol: float = 0.0
    sampling: SamplingParams | None = None
    seed_alpha: float = 1e-6
    tally: Any = None
    decode_features: frozenset[str] = frozenset()  # drawn per request (``--decode-state``; needs make_reference)

    @property
    def sampled(self) -> SamplingParams:
        """The parameters a sampled request of a schedule is given (its seed set per request)."""
        return SEEDED if self.sampling is None or self.sampling.greedy else self.sampling


@attrs.define
class ScheduleRun:
    """What running one schedule produced: each request's result, every step's outputs, what happened."""

    finished: dict[str, Generation] = attrs.Factory(dict)
    cancelled: dict[str, Generation] = attrs.Factory(dict)
    steps: list[list[RequestOutput]] = attrs.Factory(list)
    applied: list[str] = attrs.Factory(list)  # the events that met a request in flight
    cobatched: set[str] = attrs.Factory(set)  # requests advanced while another was in flight (holding state)
    error: str | None = None
    bound: int = 0  # the most steps the schedule may take
    unfinished: bool = False
    idle: list[int] = attrs.Factory(list)  # steps that advanced nothing while requests were in the engine


def _continuation(subject: BatchSubject, spec: ScheduledRequest, n: int) -> list[int]:
    """Plain greedy's ``n`` tokens after ``spec.prompt``: under its processors (no stops) where it has any."""
    if spec.decode is None or subject.make_reference is None:
        return subject.greedy(spec.prompt, n, None)
    free = attrs.evolve(spec.decode, min_tokens=0, stop=(), eos_token_ids=())
    return list(plain_decode_with(subject.make_reference(), spec.prompt, n, decode=free).tokens)


def request_of(subject: BatchSubject, index: int, spec: ScheduledRequest) -> BatchRequest:
    """The ``BatchRequest`` for ``spec``: a fresh scripted drafter following its plan on greedy's continuation
    (under the request's processors), its EOS and stop sequence taken from that continuation."""
    continuation = _continuation(subject, spec, spec.max_new_tokens + subject.k + 1)
    eos = None if spec.eos_at is None else continuation[spec.eos_at]
    decode = spec.decode
    if decode is not None and spec.stop_at is not None and spec.stop_at < len(continuation):
        decode = attrs.evolve(decode, stop=[continuation[spec.stop_at + 1 - spec.stop_length : spec.stop_at + 1]])
    drafter = ScriptedDrafter(spec.prompt, continuation, spec.plan, vocab_size=subject.vocab_size)
    # a seeded schedule entry samples, except on an engine that decodes batches greedily only (declared)
    sampled = spec.seed is not None and subject.capabilities.sampling
    sampling = subject.sampled.with_seed(spec.seed) if sampled else None
    return BatchRequest(
        request_id=f"r{index}",
        prompt=spec.prompt,
        max_new_tokens=spec.max_new_tokens,
        eos_token_id=eos,
        sampling=sampling,
        drafter=drafter,
        decode=decode,
    )


def run_schedule(
    subject: BatchSubject,
    schedule: BatchSchedule,
    *,
    engine: Any = None,
    on_step: Callable[[Any, list[RequestOutput]], None] | None = None,
    requests: Sequence[BatchRequest] | None = None,
) -> ScheduleRun:
    """Run ``schedule`` on a fresh engine (or ``engine``); any exception is the run's ``error``.

    ``requests``: the schedule's requests as built (ids ``r0``, ``r1``, ...) where the caller sets
    what ``request_of`` would not (``batch.seeds``: unseeded sampled neighbours)."""
    engine = subject.make_engine() if engine is None else engine
    if requests is None:
        requests = [request_of(subject, i, r) for i, r in enumerate(schedule.requests)]
    run = ScheduleRun()
    run.bound = sum(r.max_new_tokens + 2 for r in schedule.requests) + 2 * len(schedule.events) + 8
    pending = sorted(range(len(requests)), key=lambda i: schedule.requests[i].arrival)
    running: set[str] = set()
    try:
        for index in range(run.bound):
            while pending and schedule.requests[pending[0]].arrival <= index:
                engine.add_request(requests[pending.pop(0)])
            _apply_events(engine, schedule, index, running, run)
            if not pending and not engine.has_unfinished_requests():
                return run
            busy = engine.has_unfinished_requests()
            outs = engine.step()
            run.steps.append(outs)
            if busy and not outs:
                run.idle.append(index)
            # a round's record, or (a black-box engine reports none: vLLM) the tokens it emitted
            advanced = {o.request_id for o in outs if o.step is not None or o.new_tokens}
            if len(advanced | running) > 1:
                run.cobatched |= advanced
            for out in outs:
                running.add(out.request_id)
                if out.finished is not None:
                    run.finished[out.request_id] = out.finished
                    running.discard(out.request_id)
            if on_step is not None:
                on_step(engine, outs)
        run.unfinished = bool(pending) or engine.has_unfinished_requests()
    except Exception as exc:  # the engine's failure is the finding
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def _apply_events(engine: Any, schedule: BatchSchedule, index: int, running: set[str], run: ScheduleRun) -> None:
    modes = engine.batch_capabilities.preemption
    for event in schedule.events:
        request_id = f"r{event.request}"
        if event.at != index or request_id not in running:
            continue
        if event.action == "cancel":
            run.cancelled[request_id] = engine.abort_request(request_id)
        elif event.action in modes:
            engine.preempt(request_id, mode=event.action)
        else:
            continue
        running.discard(request_id)
        run.applied.append(f"before step {index}: {event.action} {request_id}")


def run_failed(inv: Invariant, run: ScheduleRun, example: dict[str, object]) -> list[Violation]:
    """The run's own failure (an exception, or a batch that never finished), as a violation."""
    if run.error is not None:
        return [inv.violation(f"the batched engine raised during the schedule: {run.error}", example=example)]
    if run.unfinished:
        return [inv.violation(f"the batch did not finish within {run.bound} steps", example=example)]
    return []


def _judge_outputs(
    inv: Invariant, subject: BatchSubject, schedule: BatchSchedule, run: ScheduleRun, example: dict[str, object]
) -> list[Violation]:
    """Each finished request against its solo run (greedy: plain greedy; seeded: the engine alone),
    each cancelled one's partial output a prefix of it."""
    found: list[Violation] = []
    for i, spec in enumerate(schedule.requests):
        request_id = f"r{i}"
        request = request_of(subject, i, spec)
        if spec.seed is not None:
            if not subject.capabilities.batch_invariant_seeding or request_id in run.cancelled:
                continue
            try:
                alone = run_alone(subject.make_engine(), request, max_steps=spec.max_new_tokens + 2)
            except Exception as exc:
                found.append(
                    inv.violation(f"{request_id} run alone raised {type(exc).__name__}: {exc}", example=example)
                )
                continue
            got = run.finished.get(request_id)
            if got is not None and got.tokens != alone.tokens:
                found.append(
                    inv.violation(
                        f"{request_id} (seed {spec.seed}) gave other tokens batched than run alone",
                        expected=list(alone.tokens),
                        actual=list(got.tokens),
                        example=example,
                    )
                )
            continue
        expected_stop: str | None = None
        if request.decode is not None and subject.make_reference is not None:
            plain = plain_decode_with(
                subject.make_reference(), spec.prompt, spec.max_new_tokens,
                decode=request.decode, eos_token_id=request.eos_token_id,
            )  # fmt: skip
            expected, expected_stop = list(plain.tokens), plain.stop_reason
        else:
            expected = subject.greedy(spec.prompt, spec.max_new_tokens, request.eos_token_id)
        if request_id in run.cancelled:
            partial = list(run.cancelled[request_id].tokens)
            if partial != expected[: len(partial)]:
                found.append(
                    inv.violation(
                        f"cancelled {request_id}'s partial output is not a prefix of its solo run",
                        expected=expected[: len(partial)],
                        actual=partial,
                        example=example,
                    )
                )
            continue
        got = run.finished.get(request_id)
        if got is None:
            found.append(inv.violation(f"{request_id} never finished", example=example))
            continue
        if expected_stop is not None:  # with decode parameters: plain decoding with them, token for token
            if list(got.tokens) != expected or got.stop_reason != expected_stop:
                text = (
                    f"{request_id} (decode {request.decode.to_json() if request.decode else {}}) differs from plain "
                    f"decoding with its decode parameters: {len(got.tokens)} tokens ending {got.stop_reason}, "
                    f"expected {len(expected)} ending {expected_stop}"
                )
                found.append(inv.violation(text, expected=expected, actual=list(got.tokens), example=example))
            continue
        verdict = compare_lossless(
            got.tokens,
            expected,
            tie_tolerance=subject.tie_tolerance,
            actual_stop_reason=got.stop_reason,
            expected_stop_reason="eos" if request.eos_token_id in expected else "max_new_tokens",
        )
        breach = verdict.breach()
        if breach is not None:
            breach["explanation"] = f"{request_id} differs from its solo run: {breach['explanation']}"
            breach["example"] = {**example, "first difference": breach["example"]}
            found.append(inv.violation(**breach))  # type: ignore[arg-type]
    return found


def _counted(exercised: int, found: list[Violation]) -> int:
    """What a check exercised: a violation found is always at least one thing exercised."""
    return exercised or int(bool(found))


def check_isolation(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """Each request's output equals its solo run, whatever is co-batched with it (no preemption)."""
    calm = schedule.calm()
    example = calm.describe()
    run = run_schedule(subject, calm)
    found = run_failed(inv, run, example) or _judge_outputs(inv, subject, calm, run, example)
    return found, _counted(len(run.cobatched), found), "no two requests were in flight together"


def check_decode_isolation(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """Each request equals plain decoding with its own decode parameters, whatever is in flight with it: no
    neighbour's penalties, bias, ``min_tokens`` or stop reach its row (docs/contract.md, "Decode state")."""
    calm = schedule.calm()
    if all(r.decode is None for r in calm.requests):
        return [], 0, "no request of the schedule carried decode parameters"
    example = calm.describe()
    run = run_schedule(subject, calm)
    found = run_failed(inv, run, example) or _judge_outputs(inv, subject, calm, run, example)
    decoded = {f"r{i}" for i, r in enumerate(calm.requests) if r.decode is not None}
    exercised = len(decoded & run.cobatched) if len(calm.requests) > 1 else 0
    return found, _counted(exercised, found), "no request with decode parameters was in flight beside another"


def check_schedule_invariance(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """The same outputs with the drawn preemptions and cancellations, with the arrivals reversed, and with
    the longest request preempted after its first round in each declared mode."""
    found: list[Violation] = []
    exercised = 0
    variants = [schedule, *((schedule.reordered(),) if len(schedule.requests) > 1 else ())]
    variants += [schedule.preempted(mode) for mode in subject.capabilities.preemption]
    for variant in variants:
        example = variant.describe()
        run = run_schedule(subject, variant)
        exercised += len(run.applied) + (variant is not schedule)
        found += run_failed(inv, run, example) or _judge_outputs(inv, subject, variant, run, example)
        if found:
            break
    return (
        found,
        _counted(exercised, found),
        "no preemption or cancellation met a request in flight, and one request only",
    )


def check_slot_reuse(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """Requests run one after another on one engine (A, B, ..., A again): a freed slot passes nothing on."""
    calm = schedule.calm()
    order = [*range(len(calm.requests)), 0]
    engine = subject.make_engine()
    found: list[Violation] = []
    for turn, index in enumerate(order):
        spec = attrs.evolve(calm.requests[index], arrival=0)
        single = BatchSchedule(requests=(spec,))
        example = {**calm.describe(), "order": [f"r{i}" for i in order[: turn + 1]]}
        run = run_schedule(subject, single, engine=engine)
        found = run_failed(inv, run, example) or _judge_outputs(inv, subject, single, run, example)
        if found:
            where = f"after {turn} earlier request(s) on the engine"
            return [attrs.evolve(v, explanation=f"{where}: {v.explanation}") for v in found], turn + 1, ""
    return [], len(order) - 1, "one request only"


def check_per_slot_state(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """After every step, each running request's slot state equals a fresh model fed its accepted tokens."""
    make_reference = subject.make_reference
    if make_reference is None or not subject.capabilities.per_slot_state:
        return [], 0, "the engine exposes no per-slot state (per_slot_state) or there is no model to compare with"
    calm = schedule.calm()
    example = calm.describe()
    contexts = {f"r{i}": list(r.prompt) for i, r in enumerate(calm.requests)}
    found: list[Violation] = []
    compared = [0]

    def on_step(engine: Any, outs: list[RequestOutput]) -> None:
        for out in outs:
            contexts[out.request_id].extend(out.new_tokens)
            if out.finished is not None or found:
                continue
            fresh = make_reference()
            fresh.reset()
            fresh.forward(contexts[out.request_id][:-1])
            problem = states_differ(fresh.state_arrays(), engine.slot_state(out.request_id), atol=subject.atol)
            compared[0] += 1
            if problem is not None:
                found.append(
                    inv.violation(
                        f"{out.request_id}'s slot after its round at base {out.step and out.step.base}: {problem}",
                        example={**example, "step outputs": [o.request_id for o in outs]},
                    )
                )

    run = run_schedule(subject, calm, on_step=on_step)
    found = found or run_failed(inv, run, example)
    return found, _counted(compared[0], found), "no request was still running after a step"


def check_liveness(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """Every verify round commits at least one token for each request it advanced, every step advances
    some request while any is unfinished, and the batch finishes within its bound."""
    example = schedule.describe()
    run = run_schedule(subject, schedule)
    found = run_failed(inv, run, example)
    for index, outs in enumerate(run.steps):
        for out in outs:
            if out.step is not None and not out.new_tokens:
                found.append(inv.violation(f"step {index} committed no token for {out.request_id}", example=example))
    for index in run.idle:
        found.append(inv.violation(f"step {index} advanced no request while some were unfinished", example=example))
    return found[:3], _counted(len(run.steps), found), "the schedule ran no step"
