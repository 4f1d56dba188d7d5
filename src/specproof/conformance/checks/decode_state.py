"""The decode-state checks: an engine's output with ``DecodeParams`` against plain decoding with the same
processors and stops (docs/contract.md, "Decode state").

The oracle is ``specproof.contract.decode_state`` (its own copy of the processor math) on a fresh copy
of the model, never the engine. ``draw_decode_example`` draws one request of a kind (``DECODE_KINDS``:
the processors, ``min_tokens`` against EOS, or the stops) and a draft schedule; ``run_decode_example``
runs it, with the suite's scripted drafter where the engine takes one; each check returns
``(violations, exercised, note)`` and the registry binds them to ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from hypothesis import strategies as st

from specproof.contract import DecodeParams, Generation, Target, Violation
from specproof.contract.decode_state import plain_decode_with, processor_state
from specproof.contract.errors import UnsupportedParameterError
from specproof.strategies import contexts, draft_schedules, processor_configs, stop_sets, stop_string_sets

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = [
    "PROCESSOR_FEATURES",
    "DecodeExample",
    "DecodeRun",
    "DecodeSubject",
    "check_decode_output",
    "check_processor_states",
    "draw_decode_example",
    "run_decode_example",
]

PROCESSOR_FEATURES = frozenset({"penalties", "logit_bias", "bad_words"})


@attrs.frozen(kw_only=True)
class DecodeSubject:
    """An engine case as the decode-state search sees it: fresh engines, fresh copies of the model, the
    features it declares, and whether the suite can install its drafter (``drafter``)."""

    make_engine: Callable[[], Any]
    make_reference: Callable[[], Target]
    vocab_size: int
    k: int
    features: frozenset[str]
    takes_drafter: bool
    max_prompt: int
    max_new_tokens: int


@attrs.frozen(kw_only=True)
class DecodeExample:
    """One request of a decode check: ``kind`` is what it varies (a decode check's kind; for the parity check,
    the one parameter it sets)."""

    kind: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    params: DecodeParams
    eos_token_id: int | None
    schedule: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "prompt": list(self.prompt),
            "max_new_tokens": self.max_new_tokens,
            "eos_token_id": self.eos_token_id,
            "decode": self.params.to_json(),
            "draft_schedule": [list(r) for r in self.schedule],
        }


class ScheduleDrafter:
    """Drafts ``source`` (the oracle's output, then the continuation past its stop) after the prompt, a
    round's ``(length, right)`` making the token at ``right`` wrong, so the schedule's rounds happen."""

    def __init__(self, prompt_length: int, source: Sequence[int], schedule: Sequence[tuple[int, int]], vocab: int):
        self.prompt_length, self.source, self.schedule, self.vocab = prompt_length, list(source), schedule, vocab
        self.calls = 0

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        length, right = self.schedule[self.calls % len(self.schedule)]
        self.calls += 1
        pos = len(context) - self.prompt_length
        draft = self.source[pos : pos + min(length, k)]
        if right < len(draft):
            draft[right] = (draft[right] + 1) % self.vocab
        return draft


def draw_decode_example(data: st.DataObject, subject: DecodeSubject, kind: str) -> DecodeExample:
    """One request of ``kind``: a prompt, its processors (those the engine declares), stops placed on plain
    decoding's continuation under them, and a draft schedule."""
    vocab = subject.vocab_size
    prompt = data.draw(contexts(vocab, min_size=1, max_size=min(subject.max_prompt, 16)), label="prompt")
    n = data.draw(st.integers(8, max(8, min(subject.max_new_tokens, 20))), label="max_new_tokens")
    processors = subject.features & PROCESSOR_FEATURES
    if kind not in ("penalties", "logprobs") and not data.draw(st.booleans(), label="with processors"):
        processors = frozenset()
    active = kind in ("penalties", "logprobs")  # these searches never shrink their processors to off
    base = data.draw(processor_configs(vocab, features=processors, active=active), label="processors")
    params, eos, free = base, None, None
    stops = kind != "logprobs" or ("stop_sequences" in subject.features and data.draw(st.booleans(), label="stops"))
    if kind != "penalties" and stops:
        free = plain_decode_with(subject.make_reference(), prompt, n, decode=base)
        params, eos = data.draw(stop_sets(base, free.tokens, kind=kind), label="stops")
    if kind == "logprobs":  # each token's logprob, and 0-3 alternatives
        alternatives = st.integers(0, 3) if "top_logprobs" in subject.features else st.just(0)
        params = attrs.evolve(params, logprobs=data.draw(alternatives, label="top logprobs"))
    if kind == "stop_strings" and free is not None:  # the placed stop sequences as text, or longer strings
        placed = [bytes(seq) for seq in params.stop if all(t < 256 for t in seq)]
        texts = data.draw(stop_string_sets(prompt, free.tokens, k=subject.k, placed=placed), label="stop strings")
        asked = 0 if "logprobs" in subject.features else None
        params = attrs.evolve(params, stop=(), stop_strings=texts, logprobs=asked)
    schedule = data.draw(draft_schedules(k=subject.k), label="draft schedule")
    return DecodeExample(
        kind=kind, prompt=tuple(prompt), max_new_tokens=n, params=params, eos_token_id=eos, schedule=tuple(schedule)
    )


@attrs.frozen(kw_only=True)
class DecodeRun:
    """One request run on the engine, with plain decoding's answer and the baseline its kind is judged by."""

    example: DecodeExample
    expected: Generation
    baseline: Generation  # plain decoding without what the kind varies (did the parameter matter?)
    generation: Generation | None
    error: str | None
    states: list[dict[str, object]] | None
    refused: str | None = None  # the engine's UnsupportedParameterError: a skip with its reason, not a failure


def _plain(subject: DecodeSubject, ex: DecodeExample, params: DecodeParams, eos: int | None) -> Generation:
    return plain_decode_with(subject.make_reference(), ex.prompt, ex.max_new_tokens, decode=params, eos_token_id=eos)


def run_decode_example(subject: DecodeSubject, ex: DecodeExample) -> DecodeRun:
    expected = _plain(subject, ex, ex.params, ex.eos_token_id)
    unstopped = attrs.evolve(ex.params, stop=(), stop_strings=(), eos_token_ids=(), min_tokens=0)
    free = _plain(subject, ex, unstopped, None)
    baseline = {
        "penalties": lambda: _plain(subject, ex, DecodeParams(), ex.eos_token_id),
        "min_tokens": lambda: _plain(subject, ex, attrs.evolve(ex.params, min_tokens=0), ex.eos_token_id),
        "stops": lambda: free,
        "logprobs": lambda: free,
        "stop_strings": lambda: free,
        "prompt_logprobs": lambda: free,
    }[ex.kind]()
    source = list(expected.tokens)
    if tuple(free.tokens[: len(source)]) == expected.tokens:  # drafts run on past the stop
        source = list(free.tokens)
    engine = subject.make_engine()
    if subject.takes_drafter:
        engine.drafter = ScheduleDrafter(len(ex.prompt), source, ex.schedule, subject.vocab_size)
    try:
        gen = engine.generate(list(ex.prompt), ex.max_new_tokens, eos_token_id=ex.eos_token_id, decode=ex.params)
        error = None if isinstance(gen, Generation) else f"generate returned {type(gen).__name__}, not a Generation"
    except UnsupportedParameterError as exc:  # parameter parity: refusing is allowed, ignoring is not
        return DecodeRun(
            example=ex, expected=expected, baseline=baseline, generation=None, error=None, states=None,
            refused=f"the engine refused the request: {exc}",
        )  # fmt: skip
    except Exception as exc:  # the check reports it as the engine's failure, naming the cause
        gen, error = None, f"{type(exc).__name__}: {exc}"
    states = getattr(engine, "processor_states", None)
    return DecodeRun(
        example=ex,
        expected=expected,
        baseline=baseline,
        generation=gen if error is None else None,
        error=error,
        states=list(states) if isinstance(states, (list, tuple)) else None,
    )


def _exercised(run: DecodeRun) -> tuple[int, str]:
    if run.example.kind in ("stops", "stop_strings"):
        hit = run.expected.stop_reason in ("eos", "stop_sequence")
        return int(hit), "" if hit else "plain decoding met none of the drawn stops"
    mattered = run.expected.tokens != run.baseline.tokens
    return int(mattered), "" if mattered else f"the drawn {run.example.kind} did not change plain decoding's output"


def check_decode_output(inv: Invariant, run: DecodeRun) -> tuple[list[Violation], int, str]:
    """The engine's tokens and stop reason equal plain decoding's with the same ``DecodeParams``."""
    if run.refused is not None:
        return [], 0, run.refused
    example = run.example.to_json()
    exercised, note = _exercised(run)
    gen = run.generation
    if gen is None:
        return [inv.violation(f"the generation with decode parameters failed: {run.error}", example=example)], 1, ""
    want, got = list(run.expected.tokens), list(gen.tokens)
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
        text = (
            f"output token {at} differs from plain decoding with the same decode parameters "
            f"(expected {len(want)} tokens ending {run.expected.stop_reason}, got {len(got)} ending {gen.stop_reason})"
        )
        return [inv.violation(text, expected=want[at:], actual=got[at:], example=example)], max(exercised, 1), ""
    if gen.stop_reason != run.expected.stop_reason:
        text = f"the output is right but its stop reason is {gen.stop_reason!r}, plain decoding's is "
        text += f"{run.expected.stop_reason!r}"
        return [inv.violation(text, expected=run.expected.stop_reason, actual=gen.stop_reason, example=example)], 1, ""
    return [], exercised, note


def check_processor_states(inv: Invariant, run: DecodeRun) -> tuple[list[Violation], int, str]:
    """After every round, the engine's processor state equals a fresh processor's fed only the committed tokens
    (``processor_state`` of the output's first ``generated`` tokens); one state per round."""
    if run.refused is not None:
        return [], 0, run.refused
    example = run.example.to_json()
    gen = run.generation
    if gen is None:
        return [inv.violation(f"the generation with decode parameters failed: {run.error}", example=example)], 1, ""
    if run.states is None:
        return [], 0, "the engine reported no processor_states"
    if gen.steps is not None and len(run.states) != len(gen.steps):
        text = f"the engine reported {len(run.states)} processor states for {len(gen.steps)} rounds"
        return [inv.violation(text, expected=len(gen.steps), actual=len(run.states), example=example)], 1, ""
    made = 0
    for rnd, state in enumerate(run.states):
        generated = state.get("generated") if isinstance(state, dict) else None
        if not isinstance(generated, int) or not made <= generated <= len(gen.tokens):
            text = f"round {rnd}'s processor state says {generated!r} tokens are out, not a count of the output"
            return [inv.violation(text, round=rnd, actual=state, example=example)], rnd + 1, ""
        made = generated
        fresh = processor_state(gen.tokens[:generated])
        if state != fresh:
            text = (
                f"after round {rnd} the engine's processor state is not a fresh processor's fed the "
                f"{generated} committed tokens (a rejected or missing token in the penalty buffer)"
            )
            return [inv.violation(text, round=rnd, expected=fresh, actual=state, example=example)], rnd + 1, ""
    return [], len(run.states), "" if run.states else "the engine ran no round"
