"""Batch schedules: which requests a batched engine serves, when they arrive, how each drafts, where
one is preempted or cancelled (docs/contract.md, "Batches").

``batch_schedules(...)`` draws a ``BatchSchedule``; it shrinks toward fewer requests, earlier
arrivals, shorter plans and no preemption or cancellation, so a failure is reported with the
fewest requests and rounds that still show it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from hypothesis import strategies as st

from specproof.contract import DecodeParams, Grammar
from specproof.contract.validation import int_at_least
from specproof.strategies._contexts import StrategyArgumentError
from specproof.strategies._decode_params import processor_configs
from specproof.strategies._rounds import RoundPlan, round_plans

__all__ = ["BatchSchedule", "ScheduleEvent", "ScheduledRequest", "batch_schedules"]


@attrs.frozen(kw_only=True)
class ScheduledRequest:
    """One request of a schedule: its prompt, budget, draft plan, arrival step and where its EOS is.

    ``eos_at``: the index in its greedy continuation whose token is its EOS (None: no EOS), so EOS
    can fall in the middle of one row's block; ``seed``: sample with this seed (None: greedy);
    ``decode``: its processors and ``min_tokens`` (docs/contract.md, "Decode state"; None: none), the
    continuation then plain decoding's under them; ``stop_at``: the index in that continuation where
    a one- or two-token stop sequence ends (``stop_length``), so a stop too can end mid-block.
    """

    prompt: tuple[int, ...]
    max_new_tokens: int
    plan: RoundPlan
    arrival: int = 0
    eos_at: int | None = None
    seed: int | None = None
    decode: DecodeParams | None = None
    stop_at: int | None = None
    stop_length: int = 1
    grammar: Grammar | None = None  # the request's own grammar (``batch.grammar``), its EOS the grammar EOS
    delimiter_at: int | None = None  # the grammar's reasoning delimiter ends here in the free continuation
    delimiter_length: int = 1

    def describe(self) -> str:
        eos = "" if self.eos_at is None else f", eos at {self.eos_at}"
        seed = "" if self.seed is None else f", seed {self.seed}"
        decode = "" if self.decode is None else f", decode {self.decode.to_json()}"
        stop = "" if self.stop_at is None else f", a {self.stop_length}-token stop ending at {self.stop_at}"
        grammar = "" if self.grammar is None else f", grammar {self.grammar.to_json()}"
        if self.delimiter_at is not None:
            grammar += f" after a {self.delimiter_length}-token delimiter ending at {self.delimiter_at}"
        return (
            f"prompt of {len(self.prompt)}, {self.max_new_tokens} new, arrives at step {self.arrival}, "
            f"drafts {self.plan.describe()}{eos}{seed}{decode}{stop}{grammar}"
        )


@attrs.frozen(kw_only=True)
class ScheduleEvent:
    """Before step ``at``: preempt request ``request`` (``mode``: snapshot or recompute) or cancel it."""

    at: int
    request: int
    action: str  # "snapshot", "recompute" or "cancel"


@attrs.frozen(kw_only=True)
class BatchSchedule:
    """Requests and the preemptions and cancellations placed between steps."""

    requests: tuple[ScheduledRequest, ...]
    events: tuple[ScheduleEvent, ...] = ()

    def calm(self) -> BatchSchedule:
        """The same requests with no preemption and no cancellation."""
        return attrs.evolve(self, events=())

    def reordered(self) -> BatchSchedule:
        """The same requests arriving in the reverse order (the last arrival first), no events."""
        last = max(r.arrival for r in self.requests)
        flipped = tuple(attrs.evolve(r, arrival=last - r.arrival) for r in reversed(self.requests))
        return BatchSchedule(requests=flipped)

    def preempted(self, mode: str) -> BatchSchedule:
        """The same requests with one event only: the one with the most tokens to make preempted by ``mode``
        right after its first round (so every schedule meets a preemption, whatever events it drew)."""
        index = max(range(len(self.requests)), key=lambda i: self.requests[i].max_new_tokens)
        event = ScheduleEvent(at=self.requests[index].arrival + 1, request=index, action=mode)
        return BatchSchedule(requests=self.requests, events=(event,))

    def describe(self) -> dict[str, object]:
        return {
            "requests": [f"r{i}: {r.describe()}" for i, r in enumerate(self.requests)],
            "events": [f"before step {e.at}: {e.action} r{e.request}" for e in self.events],
        }


def batch_schedules(
    *,
    vocab_size: int,
    k: int,
    max_requests: int = 4,
    max_new_tokens: int = 10,
    max_prompt: int = 12,
    preemption: tuple[str, ...] = ("snapshot", "recompute"),
    cancels: bool = True,
    seeds: bool = False,
    decode_features: frozenset[str] = frozenset(),
    grammars: Sequence[Grammar] = (),
) -> st.SearchStrategy[BatchSchedule]:
    """``BatchSchedule`` s of 1..``max_requests`` requests.

    Prompts may share a prefix with the first request's (so prefix caches engage), each request
    has its own draft plan (``round_plans``: all accepted, empty, rejected at 0, partial, short,
    full then empty), an arrival step (continuous arrivals), an EOS placed in its continuation
    (mid-block of one row) and, with ``seeds``, a sampling seed; events preempt (in the given
    modes) or cancel a request before a step. With ``decode_features`` (what the engine declares), each
    request may carry its own processors (``processor_configs``), ``min_tokens`` and a stop sequence,
    so neighbours in one verify step hold different decode state. With ``grammars``, each request may carry
    one of them (its own matcher), half the time after a reasoning delimiter placed in its free continuation.
    """
    where = "batch_schedules()"
    int_at_least(vocab_size, name="vocab_size", minimum=2, where=where, error=StrategyArgumentError)
    int_at_least(max_requests, name="max_requests", minimum=1, where=where, error=StrategyArgumentError)
    int_at_least(max_new_tokens, name="max_new_tokens", minimum=1, where=where, error=StrategyArgumentError)
    int_at_least(max_prompt, name="max_prompt", minimum=1, where=where, error=StrategyArgumentError)
    actions = (*preemption, *(("cancel",) if cancels else ()))

    @st.composite
    def schedule(draw: Any) -> BatchSchedule:
        n = draw(st.integers(1, max_requests))
        first: tuple[int, ...] = ()
        requests = []
        for i in range(n):
            own = tuple(draw(st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max_prompt)))
            shared = draw(st.integers(0, len(first))) if i else 0
            prompt = (first[:shared] + own)[: max(max_prompt, 1)]
            first = first or prompt
            new = draw(st.integers(1, max_new_tokens))
            requests.append(
                ScheduledRequest(
                    prompt=prompt,
                    max_new_tokens=new,
                    plan=draw(round_plans(k=k, max_rounds=4)),
                    arrival=draw(st.integers(0, 3)),
                    eos_at=draw(st.none() | st.integers(0, new - 1)),
                    seed=draw(st.none() | st.integers(0, 2**32 - 1)) if seeds else None,
                    **(draw(_request_decode(vocab_size, new, decode_features)) if decode_features else {}),
                    **(draw(_request_grammar(grammars, new)) if grammars else {}),
                )
            )
        events: list[ScheduleEvent] = []
        if actions:
            for _ in range(draw(st.integers(0, 2))):
                index = draw(st.integers(0, n - 1))
                # right after its first round, while it is in flight (a request may finish in a round or two)
                at = requests[index].arrival + 1
                events.append(ScheduleEvent(at=at, request=index, action=draw(st.sampled_from(actions))))
        return BatchSchedule(requests=tuple(requests), events=tuple(events))

    return schedule()


@st.composite
def _request_decode(draw: Any, vocab_size: int, new: int, features: frozenset[str]) -> dict[str, Any]:
    """One request's decode fields: none, or its processors, ``min_tokens`` and a stop, each where declared."""
    if not draw(st.booleans(), label="decode parameters"):
        return {}
    params = draw(processor_configs(vocab_size, features=features), label="processors")
    if "min_tokens" in features:
        params = attrs.evolve(params, min_tokens=draw(st.integers(0, new), label="min_tokens"))
    fields: dict[str, Any] = {"decode": params}
    if "stop_sequences" in features and draw(st.booleans(), label="stop sequence"):
        at = draw(st.integers(0, new - 1), label="stop ends at")
        fields.update(stop_at=at, stop_length=draw(st.integers(1, min(2, at + 1)), label="stop length"))
    return fields


@st.composite
def _request_grammar(draw: Any, grammars: Sequence[Grammar], new: int) -> dict[str, Any]:
    """One request's grammar fields: none, or one of ``grammars``, half the time after a 1-2 token delimiter."""
    grammar = draw(st.sampled_from((None, *grammars)), label="grammar")
    if grammar is None:
        return {}
    fields: dict[str, Any] = {"grammar": grammar}
    if draw(st.booleans(), label="reasoning delimiter"):
        at = draw(st.integers(0, new - 1), label="delimiter ends at")
        fields.update(delimiter_at=at, delimiter_length=draw(st.integers(1, min(2, at + 1)), label="delimiter length"))
    return fields
