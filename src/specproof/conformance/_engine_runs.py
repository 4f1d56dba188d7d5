"""Running engines for the engine invariants: one generation, one run record.

An ``EngineRun`` is what one example of an engine case produced: the ``RunRecord`` the
engine invariants of the registry judge (None when the generation did not complete,
with the component that broke it in ``error``) and the rounds by path. Runs and greedy
continuations are cached by their inputs in a ``RunCache`` owned by one certification,
so the one search per engine case and the per-invariant shrinking searches share them
and nothing leaks into the next certification.

The judges here (the greedy oracle, the state reference) are fresh copies of the model
fed only by forwards, never restored: a broken restore in the subject cannot hide in them.
What wraps the drafter an engine is given (the state probe, the hostile drafter) is ``_probes``'s.
"""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import numpy as np

from specproof.conformance._judges import JudgeMemo
from specproof.conformance._probes import NoDrafter, StateProbe
from specproof.conformance._records import Capabilities, RunRecord
from specproof.conformance.checks.features import FeatureJudge, feature_layers_of
from specproof.conformance.checks.generation import token_id_problem
from specproof.contract import DecodeParams, arrays_differ
from specproof.contract.decode_state import plain_decode_with
from specproof.contract.lossless import compare_lossless
from specproof.engine import DecodeError, Drafter, Generation, SpecDecoder, Step, Target, top2_margin

__all__ = [
    "PATHS",
    "CaseSearch",
    "EngineRun",
    "RunCache",
    "case_greedy",
    "classify_rounds",
    "greedy_continuation",
    "rounds_by_path",
    "run_builtin",
    "run_plugin",
]

# The rollback paths a round can take (docs/contract.md, "path coverage").
PATHS: tuple[str, ...] = (
    "all_accepted",
    "partial",
    "rejected_at_0",
    "empty_draft",
    "empty_after_full",
    "eos_in_accepted",
    "clamped_at_max_context",
)


@attrs.define
class EngineRun:
    """One generation of one engine case: the record the engine invariants judge, and its paths.

    ``record`` is None when the generation did not complete; ``error`` then names the
    component that raised and why (or, with ``invalid``, the emitted id that is not a token).
    """

    example: dict[str, object]
    record: RunRecord | None = None
    error: str | None = None
    paths: Counter[str] = attrs.Factory(Counter)
    refused: str | None = None  # the engine refused a hostile draft (allowed): why, as it said
    invalid: bool = False  # it completed with an output that is not token ids (``error`` says which)

    @property
    def completed(self) -> bool:
        return self.record is not None


@attrs.define
class CaseSearch:
    """The one search of an engine case: every example's run, in the order drawn."""

    runs: list[EngineRun] = attrs.Factory(list)
    seconds: float = 0.0
    error: BaseException | None = None
    covering: list[tuple[EngineRun, bytes]] = attrs.Factory(list)  # replayed covering examples, as saved


def rounds_by_path(runs: Iterable[EngineRun]) -> Counter[str]:
    """Rounds by rollback path over these runs (the path-coverage table's counts)."""
    total: Counter[str] = Counter()
    for run in runs:
        total.update(run.paths)
    return total


def classify_rounds(
    steps: Sequence[Step], *, k: int | None, eos: int | None, max_context: int | None, tokens: Sequence[int]
) -> Counter[str]:
    """Count the rounds of a generation by the path each took (a round may count under several)."""
    paths: Counter[str] = Counter()
    previous_full = False
    emitted = 0
    for step in steps:
        draft, accepted = step.draft, step.accepted
        j = len(accepted) - 1
        if not draft:
            paths["empty_draft"] += 1
            if previous_full:
                paths["empty_after_full"] += 1
        elif j >= len(draft):
            paths["all_accepted"] += 1
        elif j == 0:
            paths["rejected_at_0"] += 1
        else:
            paths["partial"] += 1
        previous_full = bool(draft) and j >= len(draft)
        if eos is not None and eos in accepted[:-1] and emitted + accepted.index(eos) < len(tokens):
            paths["eos_in_accepted"] += 1
        if k is not None and max_context is not None and step.base + 1 + k > max_context:
            paths["clamped_at_max_context"] += 1
        emitted += len(accepted)
    return paths


class _LRU(OrderedDict[object, Any]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key: object, value: Any) -> Any:
        self[key] = value
        if len(self) > self.size:
            self.popitem(last=False)
        return value


@attrs.define
class RunCache:
    """The runs, greedy continuations and judges of one certification.

    Owned by the ``Certification`` that fills it (never a module global), so a
    certification never sees another's verdicts; run keys also hold every setting that
    changes a verdict (``atol``, ``tie_tolerance``).
    """

    runs: _LRU = attrs.Factory(lambda: _LRU(1024))
    greedy: _LRU = attrs.Factory(lambda: _LRU(2048))
    judges: JudgeMemo = attrs.Factory(JudgeMemo)

    def clear(self) -> None:
        """Drop everything (the pytest session that filled it is over).

        Not only tidiness: Hypothesis keeps the last 128 state-machine classes in an
        ``lru_cache`` (``RuleBasedStateMachine._to_test_case``), and the rollback machine's
        class holds these judges, so without this a campaign worker running round after
        round grew by ~17 MB a round (quick) until 128 rounds were held."""
        self.runs.clear()
        self.greedy.clear()
        self.judges.clear()


def greedy_continuation(
    make_reference: Callable[[], Target] | None,
    greedy_fn: Callable[[Sequence[int], int], Sequence[int]] | None,
    key: object,
    prompt: Sequence[int],
    n: int,
    eos: int | None,
    *,
    horizon: int,
    cache: RunCache,
) -> tuple[list[int], list[float] | None]:
    """Plain greedy after ``prompt``: tokens (cut at ``n`` and the first EOS) and top-2 margins.

    One continuation of ``max(n, horizon)`` tokens per prompt is computed and cached, and every
    request for that prompt (any ``n``, any EOS) is a prefix of it: greedy is deterministic, so
    the first ``n`` tokens of a longer continuation are the continuation of length ``n``.
    """
    cache_key = (key, tuple(prompt))
    cached = cache.greedy.get(cache_key)
    if cached is None or (len(cached[0]) < n and not cached[2]):
        want = max(n, horizon)
        if make_reference is not None:
            # plain greedy on a judge fed prompt[:-1] by forwards only (memoized: long prompts recur)
            model = cache.judges.at(make_reference, prompt[:-1])
            tokens: list[int] = []
            margins: list[float] = []
            pending = int(prompt[-1])
            while len(tokens) < want and model.processed < model.max_context:
                row = np.asarray(model.forward([pending]))[0]
                pending = int(np.argmax(row))  # the first maximum: the lowest id wins a tie
                tokens.append(pending)
                margins.append(top2_margin(row))
            full = len(tokens) < want  # context_full: nothing more will come
            cached = (tokens, margins, full)
        else:
            assert greedy_fn is not None
            cached = ([int(t) for t in greedy_fn(list(prompt), want)], None, False)
        cache.greedy.remember(cache_key, cached)
    tokens, all_margins, _ = cached
    tokens = tokens[:n]
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tokens, (all_margins[: len(tokens)] if all_margins is not None else None)


def case_greedy(
    case: Any, target: Any, prompt: list[int], n: int, eos: int | None, *, horizon: int, cache: RunCache
) -> tuple[list[int], list[float] | None]:
    """Plain greedy for an engine case (``EngineCase``): on the suite's target (``target``, a
    ``TargetSubject``) for the built-in decoder, else on the plug-in's model or ``greedy()``."""
    if case.kind == "builtin":
        assert target is not None
        return greedy_continuation(
            target.make, None, ("target", target.spec), prompt, n, eos, horizon=horizon, cache=cache
        )
    return greedy_continuation(
        case.make_reference, case.greedy_fn, ("plugin", case.token), prompt, n, eos, horizon=horizon, cache=cache
    )


def _expected(
    make_reference: Callable[[], Target] | None,
    greedy_fn: Callable[[Sequence[int], int], Sequence[int]] | None,
    key: object,
    prompt: Sequence[int],
    n: int,
    eos: int | None,
    decode: DecodeParams | None,
    cache: RunCache,
    horizon: int,
) -> tuple[list[int], list[float] | None]:
    """A run's expected output: plain greedy (cached, with margins), or with ``decode`` plain decoding with its
    processors on a fresh copy of the model (the engine-case search draws them only where there is a model)."""
    if decode is None:
        return greedy_continuation(make_reference, greedy_fn, key, prompt, n, eos, horizon=horizon, cache=cache)
    assert make_reference is not None
    return list(plain_decode_with(make_reference(), prompt, n, decode=decode, eos_token_id=eos).tokens), None


def _example(
    prompt: Sequence[int],
    max_new_tokens: int,
    eos: int | None,
    drafter_kind: str,
    script: object,
    decode: DecodeParams | None,
    **settings: object,
) -> dict[str, object]:
    """A run's example as its report shows it (``settings``: the built-in decoder's k and rollback)."""
    example: dict[str, object] = {"prompt": list(prompt), **settings}
    example.update({"max_new_tokens": max_new_tokens, "eos_token_id": eos, "drafter": drafter_kind})
    if script is not None:
        example["script"] = script
    if decode is not None:
        example["decode"] = decode.to_json()
    return example


def _cause(error: BaseException) -> str:
    cause = error.__cause__ if error.__cause__ is not None else error
    return f"{type(cause).__name__}: {cause}"


def _record(
    run: EngineRun,
    gen: Generation,
    *,
    capabilities: Capabilities,
    prompt: Sequence[int],
    k: int | None,
    max_new_tokens: int,
    eos: int | None,
    max_context: int | None,
    rollback: str | None,
    final_processed: int | None,
    expected: list[int],
    margins: list[float] | None,
    tie_tolerance: float,
    probe: StateProbe,
    state: list[dict[str, Any]] | None,
    state_note: str,
    suite_drafts: bool,
    vocab_size: int | None,
) -> EngineRun:
    """Fill ``run`` with its record: what the engine exposed this time decides what applies."""
    bound = k if k is not None else max((len(s.draft) for s in gen.steps or ()), default=0)
    judge = probe.features
    caps = capabilities.with_(
        steps=True if gen.steps is not None else "the engine returns no steps (black-box)",
        stats=True if gen.stats is not None else "the engine returns no stats",
        rollback=True if rollback is not None else "the engine does not say its rollback strategy",
        target=True if state is not None else state_note,
        drafter=True
        if judge is not None
        else "no feature drafter was installed (the drafter declares no feature_layers, or there is no model "
        "to compute features with)",
        forward_with_features=True if judge is not None else "no model to compute the target's features with",
        suite_drafts=True
        if suite_drafts
        else "the engine drafted for itself (it takes no drafts from the suite: no settable drafter, or no "
        "suite_drafts capability)",
    )
    run.record = RunRecord(
        generation=gen,
        prompt=tuple(prompt),
        k=bound,
        max_new_tokens=max_new_tokens,
        eos=eos,
        max_context=max_context,
        rollback=rollback,
        final_processed=final_processed,
        # the stop reason: an engine smaller than its oracle may stop at context_full where greedy goes on
        # (docs/contract.md, "lossless"); engine.stop checks that the context was full
        lossless=compare_lossless(
            list(gen.tokens),
            expected,
            expected_margins=margins,
            tie_tolerance=tie_tolerance,
            actual_stop_reason=gen.stop_reason,
        ),
        state=None if state is None else tuple(state),
        state_checks=probe.checks,
        features=None if judge is None else tuple(judge.found),
        feature_checks=0 if judge is None else judge.checks,
        proposals=tuple(probe.proposals) if suite_drafts else None,
        vocab_size=vocab_size,
        capabilities=caps,
    )
    if gen.steps is not None:
        run.paths = classify_rounds(gen.steps, k=k, eos=eos, max_context=max_context, tokens=gen.tokens)
        run.example["drafts"] = [list(s.draft) for s in gen.steps][:16]
    return run


def _incomplete(example: dict[str, object], error: BaseException, component: str) -> EngineRun:
    hint = ""
    if example.get("max_new_tokens") == 0:
        hint = (
            " (max_new_tokens = 0 is a valid request: no tokens, stop reason max_new_tokens, no round; "
            "docs/contract.md, the decode convention)"
        )
    return EngineRun(example=example, record=None, error=f"{component} raised {_cause(error)}{hint}")


def _refused(example: dict[str, object], error: BaseException, probe: StateProbe) -> EngineRun:
    """The engine raised right after the suite sent a hostile draft: a refusal, which the rule allows."""
    sent = probe.proposals[-1]
    why = f"refused the hostile draft {list(sent.draft)[:12]} (asked for k={sent.k}): {_cause(error)}"
    return EngineRun(example=example, record=None, error=why, refused=why)


def _observational(live: Any, reference: Target, context: Sequence[int], atol: float, *, keep: bool) -> str | None:
    """Forward the pending token on both and compare the rows (advances the reference; ``keep``
    puts the live target back with its own snapshot/restore, for engines that keep their cache)."""
    if live.processed >= live.max_context or reference.processed >= reference.max_context:
        return None
    want = np.asarray(reference.forward([context[-1]]))
    snap = live.snapshot() if keep else None
    try:
        got = np.asarray(live.forward([context[-1]]))
    finally:
        if keep:
            live.restore(snap)
    return arrays_differ(want, got, atol=atol, name="the logits row of the pending token")


def _final_state_check(
    probe: StateProbe, live: Any, context: Sequence[int], atol: float, *, observe: bool, keep: bool = False
) -> list[dict[str, Any]] | None:
    """State after the generation: white-box (state arrays), then observational (the next forward)."""
    if probe.make_reference is None or live is None:
        return None
    probe.check(context, when="after the last round")
    state = list(probe.found)
    if state or int(live.processed) != len(context) - 1:
        return state if probe.checks or state else None
    if observe and callable(getattr(live, "forward", None)) and probe.reference is not None:
        why = _observational(live, probe.reference, context, atol, keep=keep)
        probe.checks += 1
        if why is not None:
            state.append(
                {"explanation": f"after the generation, the next forward differs from plain decoding's: {why}"}
            )
    return state if probe.checks else None


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
    atol: float,
    tie_tolerance: float,
    cache_key: object,
    horizon: int,
    cache: RunCache,
    capabilities: Capabilities,
    script: object = None,
    feature_layers: tuple[int, ...] | None = None,
    decode: DecodeParams | None = None,
    greedy_key: object,
) -> EngineRun:
    """Run SpecDecoder on a fresh target with a state probe; the run record the invariants judge (plain greedy
    is the cache's at ``greedy_key``; with ``decode``, plain decoding with those processors)."""
    key = (
        "builtin",
        cache_key,
        tuple(prompt),
        k,
        rollback,
        max_new_tokens,
        eos,
        drafter_kind,
        repr(script),
        atol,
        tie_tolerance,
        repr(decode),
    )
    if key in cache.runs:
        return cache.runs[key]  # type: ignore[no-any-return]
    example = _example(prompt, max_new_tokens, eos, drafter_kind, script, decode, k=k, rollback=rollback)
    target = make_target()
    probe = StateProbe(drafter, target, make_target, atol=atol, judges=cache.judges, feature_layers=feature_layers)
    try:
        decoder = SpecDecoder(target, probe, k=k, rollback=rollback)  # type: ignore[arg-type]
        gen = decoder.generate(prompt, max_new_tokens, eos_token_id=eos, decode=decode)
    except DecodeError as exc:
        if probe.refused_hostile:
            return cache.runs.remember(key, _refused(example, exc, probe))  # type: ignore[no-any-return]
        return cache.runs.remember(key, _incomplete(example, exc, "the drafter or the target"))  # type: ignore[no-any-return]
    expected, margins = _expected(make_target, None, greedy_key, prompt, max_new_tokens, eos, decode, cache, horizon)
    final = target.processed  # before the observational probe advances it
    ctx = [*prompt, *gen.tokens]
    state = _final_state_check(probe, target, ctx, atol, observe=True)
    run = _record(
        EngineRun(example=example),
        gen,
        capabilities=capabilities,
        prompt=prompt,
        k=k,
        max_new_tokens=max_new_tokens,
        eos=eos,
        max_context=target.max_context,
        rollback=rollback,
        final_processed=final,
        expected=expected,
        margins=margins,
        tie_tolerance=tie_tolerance,
        probe=probe,
        state=state,
        state_note="the target has no state_arrays() and the pending token could not be probed",
        suite_drafts=True,
        vocab_size=target.vocab_size,
    )
    return cache.runs.remember(key, run)  # type: ignore[no-any-return]


def run_plugin(
    case: Any,
    *,
    prompt: Sequence[int],
    max_new_tokens: int,
    eos: int | None,
    drafter: Drafter | None,
    drafter_kind: str,
    atol: float,
    tie_tolerance: float,
    horizon: int,
    cache: RunCache,
    script: object = None,
    decode: DecodeParams | None = None,
) -> EngineRun:
    """Run a plug-in engine (``case`` is an ``EngineCase``) following the engine contract.

    With ``drafter`` the suite's drafter is installed on the engine's ``drafter`` attribute for
    this generation (wrapped in a state probe when the engine exposes a live target).
    """
    key: tuple[object, ...] = ("plugin", case.token, tuple(prompt), max_new_tokens, eos, drafter_kind, repr(script))
    key = (*key, atol, tie_tolerance, repr(decode))
    if key in cache.runs:
        return cache.runs[key]  # type: ignore[no-any-return]
    example = _example(prompt, max_new_tokens, eos, drafter_kind, script, decode)
    engine = case.engine
    reset = getattr(engine, "reset", None)
    if callable(reset):
        reset()
    live = case.live_target
    probe = _plugin_probe(case, drafter, atol=atol, cache=cache)
    before = _fingerprint(live)
    try:
        if drafter is not None:
            engine.drafter = probe
        asked = {} if decode is None else {"decode": decode}  # an engine without decode_features is never sent one
        gen = engine.generate(list(prompt), max_new_tokens, eos_token_id=eos, **asked)
    except Exception as exc:
        if drafter is not None and probe.refused_hostile:
            return cache.runs.remember(key, _refused(example, exc, probe))  # type: ignore[no-any-return]
        return cache.runs.remember(key, _incomplete(example, exc, f"the engine {case.name}"))  # type: ignore[no-any-return]
    finally:
        if drafter is not None:
            engine.drafter = case.own_drafter
    unusable = _unusable_output(case, example, gen)
    if unusable is not None:
        return cache.runs.remember(key, unusable)  # type: ignore[no-any-return]
    if live is not None and case.live_confirmed is None and gen.tokens:
        live, probe = _confirm_live(case, probe, moved=_fingerprint(live) != before, atol=atol, cache=cache)
    expected, margins = _expected(
        case.make_reference, case.greedy_fn, ("plugin", case.token), prompt, max_new_tokens, eos, decode, cache, horizon
    )  # case_greedy's key: one cached continuation per prompt
    final = int(live.processed) if live is not None else None
    ctx = [*prompt, *gen.tokens]
    state = _final_state_check(probe, live, ctx, atol, observe=case.observable, keep=True)
    run = _record(
        EngineRun(example=example),
        gen,
        capabilities=case.exposes(),
        prompt=prompt,
        k=case.k,
        max_new_tokens=max_new_tokens,
        eos=eos,
        max_context=case.max_context,
        rollback=case.rollback,
        final_processed=final,
        expected=expected,
        margins=margins,
        tie_tolerance=tie_tolerance,
        probe=probe,
        state=state,
        state_note=case.state_note,
        suite_drafts=drafter is not None,
        vocab_size=case.vocab_size,
    )
    return cache.runs.remember(key, run)  # type: ignore[no-any-return]


def _unusable_output(case: Any, example: dict[str, object], gen: object) -> EngineRun | None:
    """The run of an output no judge may be fed: not a ``Generation``, or an id outside the vocabulary (judged
    before any model sees it, so the violation names the token, never an ``IndexError``)."""
    if not isinstance(gen, Generation):
        bad = TypeError(f"generate returned {type(gen).__name__}, not a specproof.engine.Generation")
        return _incomplete(example, bad, f"the engine {case.name}")
    bad_token = token_id_problem(gen.tokens, case.vocab_size)
    if bad_token is None:
        return None
    example["tokens"] = list(gen.tokens)
    why = f"the engine {case.name} emitted an id outside the vocabulary: {bad_token[2]}"
    return EngineRun(example=example, error=why, invalid=True)


def _plugin_probe(case: Any, drafter: Drafter | None, *, atol: float, cache: RunCache) -> StateProbe:
    """The state probe of one plug-in generation, wrapping the suite's drafter when one is installed."""
    live = case.live_target
    reference = case.make_reference if live is not None else None
    # the engine's own feature drafter's layers, else the --drafter subject's (a wire engine: EngineCase.feature_layers)
    own = feature_layers_of(case.own_drafter) or getattr(case, "feature_layers", None)
    layers = own if drafter is not None else None
    # the features are judged against a fresh copy of the model, whether or not the engine exposes its live target
    probe = StateProbe(
        drafter if drafter is not None else NoDrafter(),
        live,
        reference,
        atol=atol,
        judges=cache.judges,
        feature_layers=layers,
    )
    if layers is not None and case.make_reference is not None and probe.features is None:
        probe.features = FeatureJudge(case.make_reference, layers, atol=atol, live=live)
    return probe


def _confirm_live(case: Any, probe: StateProbe, *, moved: bool, atol: float, cache: RunCache) -> tuple[Any, StateProbe]:
    """The engine contract: `target` is the target the engine decodes on. One that never moves
    during a generation is an oracle of the same model, not the live target (no state probe then)."""
    case.confirm_live(moved)
    live = case.live_target
    if live is None:
        judge, sent = probe.features, probe.proposals
        if judge is not None:
            judge.live = None  # not the target the engine decodes on: no evidence on its state
        probe = StateProbe(probe.inner, None, None, atol=atol, judges=cache.judges)
        probe.features, probe.proposals = judge, sent
    return live, probe


def _fingerprint(live: object) -> object:
    if live is None:
        return None
    own = getattr(live, "fingerprint", None)  # a view whose state_arrays() may have no values (wire digests)
    if callable(own):
        return own()
    arrays = getattr(live, "state_arrays", None)
    state = None
    if callable(arrays):
        try:
            state = {name: np.asarray(a).tobytes() for name, a in arrays().items()}
        except Exception:
            state = None
    return (int(getattr(live, "processed", -1)), copy.deepcopy(state))
