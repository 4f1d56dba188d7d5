"""Running engines for the engine invariants: one run, every invariant's verdict.

A run is cached by its inputs, so the per-invariant certifying tests (which draw
the same examples, being one parametrized function) share one generation and one
greedy reference per example instead of repeating them for every invariant id.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import attrs
import numpy as np

from specproof.conformance._invariants import Violation
from specproof.conformance._subjects import EngineCase
from specproof.conformance.checks.generation import check_generation
from specproof.conformance.checks.lossless import compare_lossless
from specproof.conformance.checks.target import compare_logits, compare_states
from specproof.engine import DecodeError, Drafter, Generation, SpecDecoder, Target, greedy_with_margins

__all__ = ["ENGINE_INVARIANTS", "EngineRun", "StateProbe", "clear_caches", "run_builtin", "run_plugin"]

ENGINE_INVARIANTS: tuple[str, ...] = (
    "engine.lossless",
    "engine.accept-bounds",
    "engine.accept-rule",
    "engine.kv-length",
    "engine.state-restored",
    "engine.stop",
    "engine.cost",
    "trace.consistency",
)

EngineRun = dict[str, list[Violation] | None]  # invariant id -> violations (None: not applicable)


class StateProbe:
    """Wraps a drafter; at every proposal checks ``engine.state-restored``.

    When the decoder asks for a draft, the previous round's rollback is done, so the
    target under test must be the target that plain decoding of ``ctx[:-1]`` gives.
    A trusted reference (a fresh target from the same factory) is fed the new
    context tokens with plain forwards, and the device states are compared
    (white-box targets; bitwise at tolerance 0).
    """

    def __init__(
        self, inner: Drafter, target: Target, reference: Target, *, tolerance: float, prompt_length: int
    ) -> None:
        self.inner = inner
        self.target = target
        self.reference = reference
        self.tolerance = tolerance
        self.violations: list[Violation] = []
        self.rounds_checked = 0
        self._fed = 0
        self._round = 0
        self._prompt_length = prompt_length
        self.name = getattr(inner, "name", type(inner).__name__)

    def reset(self) -> None:
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    def check(self, context: Sequence[int], *, when: str) -> None:
        want = len(context) - 1
        if want > self._fed:
            self.reference.forward(list(context[self._fed : want]))
            self._fed = want
        if self.violations or not callable(getattr(self.target, "state_arrays", None)):
            return
        self.rounds_checked += 1
        if self.target.processed != want:
            return  # engine.kv-length reports this; comparing states would only repeat it
        why = compare_states(self.reference.state_arrays(), self.target.state_arrays(), tolerance=self.tolerance)  # type: ignore[attr-defined]
        if why is not None:
            self.violations.append(
                Violation(
                    invariant="engine.state-restored",
                    round=self._round if when == "round" else None,
                    explanation=f"{when}: the target is not the target plain decoding of ctx[:-1] gives: {why}",
                    example={"context_length": len(context), "prompt_length": self._prompt_length},
                )
            )

    def propose(self, context: Sequence[int], k: int) -> Sequence[int]:
        self.check(context, when="round")
        self._round += 1
        return self.inner.propose(context, k)


def _observational(target: Target, reference: Target, context: Sequence[int], tolerance: float) -> str | None:
    """Forward the pending token on both and compare the rows (changes both; call last)."""
    if target.processed >= target.max_context or reference.processed >= reference.max_context:
        return None
    a = np.asarray(reference.forward([context[-1]]))
    b = np.asarray(target.forward([context[-1]]))
    return compare_logits(a, b, tolerance=tolerance)


class _LRU(OrderedDict[object, EngineRun]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key: object, value: EngineRun) -> EngineRun:
        self[key] = value
        if len(self) > self.size:
            self.popitem(last=False)
        return value


_CACHE = _LRU(512)


def clear_caches() -> None:
    """Forget cached runs (called at the start of every certification: keys hold ``id()`` of live cases)."""
    _CACHE.clear()
    _GREEDY.clear()


_GREEDY: OrderedDict[object, tuple[list[int], list[float]]] = OrderedDict()


def _greedy(
    make_reference: Callable[[], Target], key: object, prompt: Sequence[int], n: int, eos: int | None
) -> tuple[list[int], list[float]]:
    k = (key, tuple(prompt), n, eos)
    if k not in _GREEDY:
        gen, margins = greedy_with_margins(make_reference(), prompt, n, eos_token_id=eos)
        _GREEDY[k] = (list(gen.tokens), margins)
        if len(_GREEDY) > 1024:
            _GREEDY.popitem(last=False)
    return _GREEDY[k]


def _verdicts(
    gen: Generation | None,
    error: Exception | None,
    *,
    prompt: Sequence[int],
    k: int | None,
    max_new_tokens: int,
    eos: int | None,
    max_context: int | None,
    rollback: str | None,
    final_processed: int | None,
    expected: list[int],
    margins: list[float] | None,
    tolerance: float,
    state: list[Violation] | None,
    example: Mapping[str, object],
) -> EngineRun:
    if error is not None or gen is None:
        # The run did not complete, so only losslessness can be judged (it fails: tokens are
        # missing); the others are not applicable. The message names the component at fault
        # (a drafter or target contract breach carries its invariant id).
        cause = error.__cause__ if error is not None and error.__cause__ is not None else error
        v = Violation(
            invariant="engine.lossless",
            explanation=f"the generation did not complete: {type(cause).__name__}: {cause}",
            example=dict(example),
        )
        failed: EngineRun = dict.fromkeys(ENGINE_INVARIANTS)
        failed["engine.lossless"] = [v]
        return failed
    out: EngineRun = dict.fromkeys(ENGINE_INVARIANTS)
    checked = check_generation(
        gen,
        prompt=prompt,
        # an engine that does not say its k: bound drafts by the longest one it made (no k+1 bound)
        k=k if k is not None else max((len(s.draft) for s in gen.steps or ()), default=0),
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        max_context=max_context,
        rollback=rollback,
        final_processed=final_processed,
    )
    for inv, vs in checked.items():
        out[inv] = [attrs_evolve(v, inv, example) for v in vs]
    verdict = compare_lossless(list(gen.tokens), expected, expected_margins=margins, tie_tolerance=tolerance)
    out["engine.lossless"] = (
        [] if verdict.violation is None else [attrs_evolve(verdict.violation, "engine.lossless", example)]
    )
    out["lossless-verdict"] = verdict  # type: ignore[assignment]
    out["engine.state-restored"] = state
    return out  # ids check_generation did not check (no steps / stats) stay None: not applicable


def attrs_evolve(v: Violation, invariant: str, example: Mapping[str, object] | None = None) -> Violation:
    merged = {**dict(example or {}), **v.example}
    return attrs.evolve(v, invariant=invariant, example=merged)


def run_builtin(
    *,
    make_target: Callable[[], Target],
    drafter: Drafter,
    drafter_kind: str,
    prompt: Sequence[int],
    k: int,
    rollback: str,
    max_new_tokens: int,
    eos: int | None,
    tolerance: float,
    cache_key: object,
    script: object = None,
) -> EngineRun:
    """Run SpecDecoder on a fresh target with a state probe; every engine invariant's verdict."""
    key = ("builtin", cache_key, tuple(prompt), k, rollback, max_new_tokens, eos, drafter_kind, repr(script))
    if key in _CACHE:
        return _CACHE[key]
    target = make_target()
    probe = StateProbe(drafter, target, make_target(), tolerance=tolerance, prompt_length=len(prompt))
    example: dict[str, object] = {
        "prompt": list(prompt),
        "k": k,
        "rollback": rollback,
        "max_new_tokens": max_new_tokens,
        "eos_token_id": eos,
        "drafter": drafter_kind,
    }
    if script is not None:
        example["script"] = script
    gen: Generation | None = None
    error: Exception | None = None
    try:
        gen = SpecDecoder(target, probe, k=k, rollback=rollback).generate(prompt, max_new_tokens, eos_token_id=eos)  # type: ignore[arg-type]
    except DecodeError as exc:
        error = exc
    expected, margins = _greedy(make_target, cache_key, prompt, max_new_tokens, eos)
    state: list[Violation] | None = None
    final = None if gen is None else target.processed  # before the observational probe advances it
    if gen is not None:
        ctx = [*prompt, *gen.tokens]
        probe.check(ctx, when="after the last round")
        state = list(probe.violations)
        if not state and target.processed == len(ctx) - 1:
            why = _observational(target, probe.reference, ctx, tolerance)
            if why is not None:
                state.append(
                    Violation(
                        invariant="engine.state-restored",
                        explanation=f"after the generation, the next forward differs from plain decoding's: {why}",
                    )
                )
        example["drafts"] = [list(s.draft) for s in gen.steps or ()][:12]
    return _CACHE.remember(
        key,
        _verdicts(
            gen,
            error,
            prompt=prompt,
            k=k,
            max_new_tokens=max_new_tokens,
            eos=eos,
            max_context=target.max_context,
            rollback=rollback,
            final_processed=final,
            expected=expected,
            margins=margins,
            tolerance=tolerance,
            state=state,
            example=example,
        ),
    )


def run_plugin(
    case: EngineCase, *, prompt: Sequence[int], max_new_tokens: int, eos: int | None, tolerance: float
) -> EngineRun:
    """Run a plug-in engine; white-box invariants where its Generation has steps."""
    key = ("plugin", case.token, tuple(prompt), max_new_tokens, eos)
    if key in _CACHE:
        return _CACHE[key]
    engine = case.engine
    assert engine is not None and case.greedy is not None
    example: dict[str, object] = {"prompt": list(prompt), "max_new_tokens": max_new_tokens, "eos_token_id": eos}
    gen: Generation | None = None
    error: Exception | None = None
    try:
        gen = engine.generate(list(prompt), max_new_tokens, eos_token_id=eos)
    except Exception as exc:
        error = exc
    expected, margins = case.greedy(prompt, max_new_tokens, eos)
    target = case.target
    state: list[Violation] | None = None
    final = None
    if gen is not None and target is not None and callable(getattr(target, "state_arrays", None)):
        # white-box state check after the run: compare with a trusted copy fed ctx[:-1]
        import copy

        ctx = [*prompt, *gen.tokens]
        final = target.processed
        if target.processed == len(ctx) - 1:
            ref = copy.deepcopy(target)
            ref.reset()
            ref.forward(ctx[:-1])
            why = compare_states(ref.state_arrays(), target.state_arrays(), tolerance=tolerance)  # type: ignore[attr-defined]
            state = (
                []
                if why is None
                else [
                    Violation(
                        invariant="engine.state-restored",
                        explanation=f"after the generation, the target is not what plain decoding of ctx[:-1] gives: "
                        f"{why}",
                    )
                ]
            )
    if gen is not None and gen.steps:
        example["drafts"] = [list(s.draft) for s in gen.steps][:12]
    return _CACHE.remember(
        key,
        _verdicts(
            gen,
            error,
            prompt=prompt,
            k=case.k,
            max_new_tokens=max_new_tokens,
            eos=eos,
            max_context=case.max_context,
            rollback=case.rollback,
            final_processed=final,
            expected=expected,
            margins=margins,
            tolerance=tolerance,
            state=state,
            example=example,
        ),
    )
