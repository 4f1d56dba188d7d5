"""batch.grammar: requests with their own grammars batched together (docs/contract.md, "Decode state",
"Batches").

A schedule's requests each may carry one of the grammar check's grammars (``ScheduledRequest.grammar``),
half the time after a reasoning delimiter placed in its free continuation, beside its own processors and
the grammar's EOS id. Each request needs its own matcher, advanced through its own row's draft and rolled
back to its own emitted tokens: a matcher shared between two requests, or a rollback applied to a
neighbour's matcher, changes what a row allows. A greedy request is judged token for token (and on its
stop reason) against plain decoding with its grammar; a sampled one on every emitted prefix (each valid)
and, where seeding is batch-invariant, against the same request run alone; a cancelled one's partial
output on its prefix. Greedy requests draft their scripted plan along plain decoding's output and on past
it with the free continuation (tokens the grammar forbids); sampled ones draft with ``GrammarWalkDrafter``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from specproof.conformance.checks.batch import BatchSubject, ScheduleRun, run_failed, run_schedule
from specproof.conformance.checks.decode_grammar import grammar_eos
from specproof.conformance.checks.decode_grammar_sampled import GrammarWalkDrafter
from specproof.contract import BatchRequest, DecodeParams, Generation, Violation, run_alone
from specproof.contract.decode_state import first_invalid_token, plain_decode_with
from specproof.strategies import BatchSchedule, ScheduledRequest, ScriptedDrafter

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["GrammarRequest", "check_batch_grammar", "grammar_request"]

Result = tuple[list[Violation], int, str]


@attrs.frozen(kw_only=True)
class GrammarRequest:
    """A schedule entry as sent (``request``) and what it must give: plain decoding with its parameters
    (``expected``; None for a sampled request, judged on its prefixes and its run alone)."""

    request: BatchRequest
    expected: Generation | None


def grammar_request(subject: BatchSubject, index: int, spec: ScheduledRequest) -> GrammarRequest:
    """The request for ``spec``: its processors (no ``min_tokens``, bad words or stops: a grammar may need any
    token, and ends on its EOS), its grammar after its delimiter, its drafter, its sampling where seeded."""
    assert subject.make_reference is not None
    eos = grammar_eos(subject.vocab_size)
    assert eos is not None  # the driver asks for batch_grammar only where the vocabulary has one (usable)
    base = attrs.evolve(spec.decode or DecodeParams(), min_tokens=0, bad_words=(), stop=(), eos_token_ids=[eos])
    n = spec.max_new_tokens
    free = list(plain_decode_with(subject.make_reference(), spec.prompt, n + subject.k + 1, decode=base).tokens)
    decode = base
    if spec.grammar is not None:
        grammar = spec.grammar
        at, text = spec.delimiter_at, [t for t in free if t != eos]
        if at is not None and at < len(text):
            grammar = attrs.evolve(grammar, reasoning_end=text[at + 1 - spec.delimiter_length : at + 1])
        decode = attrs.evolve(base, grammar=grammar)
    sampled = spec.seed is not None and subject.capabilities.sampling
    expected = None if sampled else plain_decode_with(subject.make_reference(), spec.prompt, n, decode=decode)
    drafter: object
    if sampled and decode.grammar is not None:  # drafts what the grammar allows after whatever was sampled
        drafter = GrammarWalkDrafter(len(spec.prompt), decode.grammar, frozenset({eos}), subject.vocab_size)
    else:  # the plan along plain decoding's output, then on past it with the free continuation
        source = free if expected is None else [*expected.tokens, *free]
        drafter = ScriptedDrafter(spec.prompt, source, spec.plan, vocab_size=subject.vocab_size)
    request = BatchRequest(
        request_id=f"r{index}",
        prompt=spec.prompt,
        max_new_tokens=n,
        sampling=subject.sampled.with_seed(spec.seed) if sampled else None,
        drafter=drafter,  # type: ignore[arg-type]
        decode=decode,
    )
    return GrammarRequest(request=request, expected=expected)


def check_batch_grammar(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """Each request with its own grammar gives what plain decoding (or, sampled, its run alone) gives with it,
    whatever is batched with it, preempted or cancelled around it."""
    grammared = {f"r{i}" for i, r in enumerate(schedule.requests) if r.grammar is not None}
    if subject.make_reference is None:
        return [], 0, "there is no model to decode plainly with (`oracle`)"
    if not grammared:
        return [], 0, "no request of the schedule carried a grammar"
    example = schedule.describe()
    built = [grammar_request(subject, i, spec) for i, spec in enumerate(schedule.requests)]
    run = run_schedule(subject, schedule, requests=[b.request for b in built])
    found = run_failed(inv, run, example)
    for item in built if not found else ():
        found += _judge(inv, subject, item, run, example)
    exercised = len(grammared & run.cobatched) if len(built) > 1 else 0
    return found, exercised or int(bool(found)), "no request with a grammar was in flight beside another"


def _judge(
    inv: Invariant, subject: BatchSubject, item: GrammarRequest, run: ScheduleRun, example: dict[str, object]
) -> list[Violation]:
    """One request's output: every prefix valid under its grammar; greedy, plain decoding's (a prefix of it when
    cancelled); sampled and finished, its run alone's where seeding is batch-invariant."""
    request, rid = item.request, item.request.request_id
    got = run.cancelled[rid] if rid in run.cancelled else run.finished.get(rid)
    if got is None:
        return [inv.violation(f"{rid} never finished", example=example)]
    tokens, grammar = list(got.tokens), request.decode.grammar if request.decode else None
    if grammar is not None:
        eos = request.decode.eos_set(None) if request.decode else frozenset()
        at = first_invalid_token(grammar, eos, subject.vocab_size, tokens)
        if at is not None:
            text = f"{rid}'s output token {at} ({tokens[at]}) is not allowed there by its {grammar.kind} grammar"
            return [inv.violation(text, actual=tokens[: at + 1], example=example)]
    if item.expected is not None:
        want = list(item.expected.tokens)
        if rid in run.cancelled:  # its partial output: a prefix of plain decoding's
            wrong = tokens != want[: len(tokens)]
        else:
            wrong = tokens != want or got.stop_reason != item.expected.stop_reason
        if wrong:
            text = (
                f"{rid} (decode {request.decode.to_json() if request.decode else {}}) differs from plain decoding "
                f"with its grammar: {len(tokens)} tokens ending {got.stop_reason}, expected {len(want)} ending "
                f"{item.expected.stop_reason}"
            )
            return [inv.violation(text, expected=want, actual=tokens, example=example)]
        return []
    if rid in run.cancelled or not subject.capabilities.batch_invariant_seeding:
        return []
    try:
        alone = run_alone(subject.make_engine(), request, max_steps=request.max_new_tokens + 2)
    except Exception as exc:  # the engine's failure alone is the finding
        return [inv.violation(f"{rid} run alone raised {type(exc).__name__}: {exc}", example=example)]
    if list(alone.tokens) != tokens:
        seed = request.sampling.seed if request.sampling else None
        text = f"{rid} (seed {seed}, with its grammar) gave other tokens batched than run alone"
        return [inv.violation(text, expected=list(alone.tokens), actual=tokens, example=example)]
    return []
