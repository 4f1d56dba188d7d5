"""Running a session: one engine, a list of requests, each judged against plain greedy.

``_SessionRunner`` issues ``SessionRequest``s to one engine instance (installing the
recorded ``ScriptedDrafter`` for scripted requests) and compares every request's tokens
with plain greedy from the oracle, tie-aware (``compare_lossless``), with its length and
stop reason; given a reference, the engine's live target must also hold exactly the
context after each request. A request with ``feature_layers`` installs its drafter behind a
feature watch (``_session_features``) that declares those layers, so the engine hands it the target's features,
and judges every proposal's rows with a ``FeatureJudge`` (a fresh copy of the model fed the
accepted context by plain forwards): on prefix hits, edits, regenerations and user turns
alike. The ``SessionMachine`` drives one runner for a whole run; ``replay_session`` replays
a saved ``SessionHistory`` on a fresh engine, and
``shrink_history`` shortens a failing history by such replays (drop requests, then simplify
EOS, budget and plan): far cheaper than Hypothesis's shrinker, which re-runs whole sessions
for every choice.

A failing request is a ``SessionFailure`` (an ``AssertionError``) whose ``example`` holds
the whole request history; the runner names no invariant id: certification reports it as
a violation of the session invariant (docs/contract.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from numbers import Integral
from typing import Any, Protocol

import attrs
from hypothesis import event

from specproof.contract import STOP_REASONS, UsageError, live_state_differs
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.contract.lossless import compare_lossless
from specproof.contract.validation import int_at_least
from specproof.engine import greedy_with_margins
from specproof.engine.plugin_modules import takes_suite_drafts
from specproof.strategies._machine import check_tolerance
from specproof.strategies._request_relations import DESCRIPTIONS as RELATION_DESCRIPTIONS
from specproof.strategies._request_relations import SESSION_KIND, relation_of
from specproof.strategies._rounds import RoundPlan, ScriptedDrafter
from specproof.strategies._session_decode import DecodeOracle
from specproof.strategies._session_features import SessionFeatures
from specproof.strategies._session_history import SessionHistory, SessionRequest

__all__ = [
    "GreedyOracle",
    "SessionFailure",
    "SetDrafter",
    "engine_greedy",
    "replay_session",
    "shrink_history",
    "target_greedy",
]

_DEFAULT_K = 4  # the plan's draft budget for an engine that does not say its k


class SessionFailure(AssertionError):
    """A request of a session broke losslessness (or left the target off the context).

    ``str(self)`` is the explanation (``request i (kind), after n earlier request(s) ...: why``);
    ``example`` is ``{"history": [...], "failing_request": i, "vocab_size": v}``, which
    ``SessionHistory.from_example`` reads back. Certification maps it to the session invariant.
    """

    def __init__(self, explanation: str, *, expected: object, actual: object, example: Mapping[str, object]) -> None:
        super().__init__(explanation)
        self.explanation = explanation
        self.expected = expected
        self.actual = actual
        self.example = dict(example)

    @property
    def failing_request(self) -> int:
        """The index of the failing request in the history."""
        return int(self.example["failing_request"])  # type: ignore[call-overload]


class GreedyOracle(Protocol):
    """``greedy(prompt, max_new_tokens, eos_token_id) -> (tokens, top-2 margins or None)``: plain greedy.

    An oracle that asks the engine under test itself (its own ``greedy``, sharing its caches)
    says so with an attribute ``shares_engine = True``: the engine may then hold the oracle's
    continuations too, and the prefix-reuse bound counts them.
    """

    def __call__(
        self, prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None, /
    ) -> tuple[list[int], list[float] | None]: ...


SetDrafter = Callable[[Any, Sequence[int], Sequence[int], RoundPlan], None]


# --------------------------------------------------------------------------- oracles


def target_greedy(target: Any) -> GreedyOracle:
    """A ``GreedyOracle`` over a Target the engine does not decode on (``greedy_with_margins``; margins given)."""

    def greedy(prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None) -> tuple[list[int], list[float]]:
        gen, margins = greedy_with_margins(target, prompt, max_new_tokens, eos_token_id=eos_token_id)
        return [int(t) for t in gen.tokens], [float(m) for m in margins]

    return greedy


def engine_greedy(engine: Any) -> GreedyOracle:
    """A ``GreedyOracle`` over an engine's own ``greedy(prompt, max_new_tokens) -> list[int]`` (no margins).

    Pass an engine instance the machine does not drive (a second one from the factory):
    an oracle that shares the engine's caches could hide the bug it is meant to judge.
    """
    method = getattr(engine, "greedy", None)
    if not callable(method):
        raise InvalidSettingError(f"engine_greedy: {engine!r} has no greedy(prompt, max_new_tokens) method")

    def greedy(prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None) -> tuple[list[int], None]:
        tokens = [int(t) for t in method(list(prompt), max_new_tokens)]
        if eos_token_id is not None and eos_token_id in tokens:
            tokens = tokens[: tokens.index(eos_token_id) + 1]
        return tokens, None

    return greedy


# --------------------------------------------------------------------------- running requests


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    # the zoo's session engines have their own copy (_common_prefix): a judge shares no code with its subjects
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class _SessionRunner:
    """Issues requests to one engine and judges each against the oracle; shared by the machine and replay."""

    def __init__(
        self,
        engine: Any,
        *,
        greedy: GreedyOracle,
        vocab_size: int,
        tie_tolerance: float,
        set_drafter: SetDrafter | None,
        memo: dict[tuple[int, ...], tuple[int, list[int], list[float] | None]] | None = None,
        ask_at_least: int = 0,
        reference: Any = None,
        atol: float = 0.0,
        feature_layers: Sequence[int] | None = None,
        feature_reference: Callable[[], Any] | None = None,
        decode_reference: Callable[[], Any] | None = None,
    ) -> None:
        self.engine = engine
        self.decode = DecodeOracle(decode_reference)  # the oracle of requests with decode parameters
        self.decode_refused: list[str] = []  # why the engine refused each request's decode parameters
        self.greedy = greedy
        self.vocab_size = vocab_size
        self.tie_tolerance = tie_tolerance
        self.set_drafter = set_drafter
        # an engine that declares capabilities without suite_drafts is judged on its own drafts
        self.settable = set_drafter is not None or takes_suite_drafts(engine)
        # "engine": the drafter the engine came with, put back for requests that use it
        self.own_drafter = getattr(engine, "drafter", None)
        self.can_choose_own = set_drafter is None and self.settable
        self.can_reset = callable(getattr(engine, "reset", None))
        self.history: list[SessionRequest] = []
        # plain greedy is a function of the prompt: one memo may serve every example of a run
        self._greedy_memo = {} if memo is None else memo
        self.ask_at_least = ask_at_least  # ask the oracle for this many tokens at least (fewer calls)
        # white-box: the live target's state after each request against a fresh reference's
        live = getattr(engine, "target", None)
        self.live = live if reference is not None and callable(getattr(live, "state_arrays", None)) else None
        self.reference: Any = reference if self.live is not None else None
        self.atol = atol
        # prefix reuse (docs/contract.md, "Sessions"): an engine that keeps caches declares it and reports
        # stats.prefix_reused; the runner bounds the claim by what the engine can have processed since
        # its last reset, and holds a declared engine to reusing a prompt that continues the last context.
        # Only a request that reports the figure is judged on it (docs/protocol.md, Compatibility: an
        # engine written before the field existed is not failed for omitting it)
        self.reuses_prefix = getattr(engine, "reuses_prefix", False) is True
        #: requests of a declared engine whose stats said nothing of prefix_reused (reuse not judged)
        self.reuse_unreported = 0
        self._seen: list[list[int]] = []  # contexts the engine may hold since its last reset
        self.oracle_shares_engine = getattr(greedy, "shares_engine", False) is True
        self._last_context: list[int] | None = None  # what the previous generate left processed
        # features (docs/contract.md, "Feature drafters"): a request may install a feature drafter
        self.features = SessionFeatures(
            layers=feature_layers, own_drafter=self.own_drafter, reference=feature_reference, atol=atol, live=self.live
        )

    @property
    def judges_features(self) -> bool:
        """A request may install a feature drafter here (the runner sets the drafter; layers and a model known)."""
        return self.settable and self.set_drafter is None and self.features.ready

    @property
    def plan_k(self) -> int:
        k = getattr(self.engine, "k", None)
        if isinstance(k, Integral) and not isinstance(k, bool) and int(k) >= 0:
            return int(k)
        return _DEFAULT_K

    def continuation(self, prompt: Sequence[int], n: int) -> tuple[list[int], list[float] | None]:
        """Plain greedy's first ``n`` tokens after ``prompt`` (no EOS), memoised per prompt."""
        key = tuple(prompt)
        memo = self._greedy_memo.get(key)
        if memo is not None and (memo[0] >= n or len(memo[1]) < memo[0]):
            _, tokens, margins = memo
            return tokens[:n], None if margins is None else margins[:n]
        ask = max(n, self.ask_at_least)
        tokens, margins = self.greedy(list(prompt), ask, None)
        tokens = [int(t) for t in tokens]
        margins = None if margins is None else [float(m) for m in margins]
        self._greedy_memo[key] = (ask, tokens, margins)
        return tokens[:n], None if margins is None else margins[:n]

    def _install(self, req: SessionRequest, continuation: list[int]) -> None:
        self.features.watch = None
        if req.drafter is None:
            return
        if not self.settable:
            raise UsageError(
                f"the session asks for drafter={req.drafter!r} but the engine {self.engine!r} has no settable "
                "'drafter' and no set_drafter hook was given"
            )
        if req.feature_layers is not None and (self.set_drafter is not None or not self.features.can_judge):
            raise UsageError(
                f"the session installs a feature drafter (layers {list(req.feature_layers)}) to judge the features "
                "the engine hands it, which needs the runner to set engine.drafter itself (no set_drafter hook) and "
                "a fresh copy of the model to compute the features with (feature_reference_factory)"
            )
        if req.drafter == "engine":
            if not self.can_choose_own:
                raise UsageError("the session puts back the engine's own drafter, which a set_drafter hook cannot do")
            self.engine.drafter = self.features.watched(req.feature_layers, self.own_drafter)
            return
        plan = req.round_plan()
        assert plan is not None  # SessionRequest.from_json guarantees a plan for scripted requests
        if self.set_drafter is not None:
            self.set_drafter(self.engine, list(req.prompt), list(continuation), plan)
        else:
            scripted = ScriptedDrafter(req.prompt, continuation, plan, vocab_size=self.vocab_size)
            self.engine.drafter = self.features.watched(req.feature_layers, scripted)

    def run(self, req: SessionRequest) -> tuple[list[int], SessionFailure | None]:
        """Append ``req`` to the history, run it; return the engine's tokens and the failure, if any."""
        index = len(self.history)
        self.history.append(req)
        if req.kind == "reset":
            try:
                self.engine.reset()
            except Exception as err:
                return [], self._failure(index, f"engine.reset() raised {type(err).__name__}: {err}", None, None)
            self._seen.clear()
            self._last_context = None
            return [], None
        prompt = list(req.prompt)
        continuation, expected, expected_margins, expected_stop = _expectation(self, req)
        self._install(req, continuation)
        try:
            gen = _call(self.engine, req)
        except Exception as err:
            if req.decode is not None and isinstance(err, UnsupportedParameterError):
                return self._refused(prompt, err)
            return [], self._failure(
                index, f"generate raised {type(err).__name__}: {err}", expected, None, stop=expected_stop
            )
        tokens = [int(t) for t in getattr(gen, "tokens", ())]
        stop = getattr(gen, "stop_reason", None)
        verdict = compare_lossless(
            tokens,
            expected,
            expected_margins=expected_margins,
            tie_tolerance=self.tie_tolerance,
            actual_stop_reason=stop if stop in STOP_REASONS and stop != "error" else None,
            expected_stop_reason=expected_stop,
        )
        # the target's outputs and state are judged before the features it handed: a wrong target makes wrong
        # features, and the failure names the target then (the features' breach, if any, as a consequence)
        features = self.features.breach(prompt, gen)
        if verdict.status == "fail":
            why = verdict.explanation + self._also(features)
            return tokens, self._failure(index, why, expected, tokens, stop=expected_stop)
        if verdict.status == "excused":
            event("SessionMachine: an excused near-tie")
        elif len(tokens) != len(expected):
            return tokens, self._failure(
                index,
                f"the engine emitted {len(tokens)} tokens (stop {stop!r}); plain greedy emits {len(expected)} "
                f"({expected_stop})" + self._also(features),
                expected,
                tokens,
                stop=expected_stop,
            )
        elif stop != expected_stop:
            return tokens, self._failure(
                index,
                f"the tokens equal plain greedy's but stop_reason is {stop!r}; it must be {expected_stop!r}",
                expected,
                tokens,
                stop=expected_stop,
            )
        return tokens, (
            self._check_reuse(index, prompt, gen)
            or self._check_state(index, [*prompt, *tokens], also=self._also(features))
            or self._feature_failure(index, features)
        )

    def _refused(self, prompt: list[int], err: Exception) -> tuple[list[int], None]:
        """Decode parameters refused (allowed: docs/contract.md, "Decode state"): nothing judged, counted."""
        self.decode_refused.append(f"{type(err).__name__}: {err}")
        self._seen.append(prompt[:-1])
        self._last_context = None
        return [], None

    @staticmethod
    def _also(features: str | None) -> str:
        return "" if features is None else f" (and {features}: the target is judged first)"

    def _feature_failure(self, index: int, features: str | None) -> SessionFailure | None:
        return None if features is None else self._failure(index, features, None, None)

    def _check_reuse(self, index: int, prompt: list[int], gen: Any) -> SessionFailure | None:
        """``stats.prefix_reused`` against what the engine can have cached, and a declared cache against disuse.

        Sound for any cache design (one sequence, snapshots, a radix tree over every request):
        the engine cannot reuse more of ``prompt[:-1]`` than the longest prefix it shares with
        some context processed since the last reset (requests, and the oracle's continuations
        in case the oracle is the engine's own ``greedy``); and an engine that declares
        ``reuses_prefix`` must reuse something of a prompt that continues exactly the context
        the previous request left, which every cache design holds. A request whose stats do not
        report ``prefix_reused`` is not judged on it (counted in ``reuse_unreported`` when the
        engine declares a cache), so an engine older than the field is not failed for lacking it.
        """
        want = prompt[:-1]
        shared = max((_shared_prefix(ctx, want) for ctx in self._seen), default=0)
        last, self._last_context = self._last_context, [*prompt, *[int(t) for t in getattr(gen, "tokens", ())]][:-1]
        self._seen.append(self._last_context)
        stats = getattr(gen, "stats", None)
        declared = "the engine keeps caches between requests (it declares reuses_prefix; over the wire: `sessions`)"
        reused = getattr(stats, "prefix_reused", None)
        if reused is None:
            # not reported: nothing to judge (the field came after specproof-engine/1 was published; a
            # check added later applies to what the engine reports; docs/protocol.md, Compatibility)
            if self.reuses_prefix:
                self.reuse_unreported += 1
            return None
        if isinstance(reused, bool) or not isinstance(reused, Integral) or not 0 <= int(reused) <= len(want):
            return self._failure(
                index,
                f"stats.prefix_reused={reused!r}: it must be an integer from 0 to {len(want)} (the prompt's tokens "
                "but the pending one)",
                None,
                None,
            )
        if int(reused) > shared:
            return self._failure(
                index,
                f"the engine reports reusing {int(reused)} prompt tokens from its caches (stats.prefix_reused), but "
                f"no context it processed since its last reset shares more than the first {shared} of this "
                f"prompt's {len(want)} (all but the pending one): it cannot have cached the rest",
                shared,
                int(reused),
            )
        if self.reuses_prefix and last and want[: len(last)] == last and int(reused) == 0:
            return self._failure(
                index,
                f"{declared}, but it re-prefilled all {len(want)} prompt tokens (stats.prefix_reused = 0) although "
                f"the prompt continues exactly the {len(last)} tokens the previous request left processed",
                len(last),
                0,
            )
        return None

    def _check_state(self, index: int, ctx: list[int], *, also: str = "") -> SessionFailure | None:
        """White-box (a reference given, the engine's live target has ``state_arrays``): the target holds ``ctx[:-1]``.

        The decode convention leaves the target at every token but the pending one after a
        generation; its state must equal a fresh reference's fed ``ctx[:-1]`` with plain
        forwards (bitwise, or within ``atol``). A stale recurrent state that the next tokens
        happen not to reveal (a short conv window refilled, a decaying recurrent state) shows here.
        """
        if self.live is None:
            return None
        processed = int(self.live.processed)
        if processed != len(ctx) - 1:
            return self._failure(
                index,
                f"after the request the engine's target has processed {processed} tokens; the context has "
                f"{len(ctx)}, so it must be {len(ctx) - 1} (every token but the pending one)",
                len(ctx) - 1,
                processed,
            )
        ref = self.reference
        ref.reset()
        if len(ctx) > 1:
            ref.forward(ctx[:-1])
        problem = live_state_differs(ref.state_arrays(), self.live, atol=self.atol)
        if problem is None:
            return None
        return self._failure(
            index,
            f"the tokens equal plain greedy's, but the engine's target does not hold the context: {problem} "
            f"(the reference was fed ctx[:-1], {len(ctx) - 1} tokens, with plain forwards){also}",
            None,
            None,
        )

    def _failure(
        self,
        index: int,
        why: str,
        expected: list[int] | int | None,
        actual: list[int] | int | None,
        *,
        stop: str | None = None,
    ) -> SessionFailure:
        req = self.history[index]
        before = "the first request" if index == 0 else f"after {index} earlier request(s) on the same engine"
        history = SessionHistory(requests=tuple(self.history), vocab_size=self.vocab_size, failing_request=index)
        explanation = f"request {index} ({req.kind}), {before}: {why}"
        if req.decode is not None:
            explanation += f" [with decode parameters {req.decode.to_json()}: the oracle is plain decoding with them]"
        if stop is not None and expected is not None:
            explanation += f" [greedy stops at {stop}]"
        return SessionFailure(
            explanation,
            expected=expected,
            actual=actual,
            example={"history": history.to_json()["requests"], "failing_request": index, "vocab_size": self.vocab_size},
        )


def _expectation(runner: _SessionRunner, req: SessionRequest) -> tuple[list[int], list[int], list[float] | None, str]:
    """What the drafter follows (the continuation without the call's EOS), the expected tokens, their top-2
    margins (None: judged exactly) and stop reason: plain greedy, or plain decoding with ``req.decode``."""
    prompt, n = list(req.prompt), req.max_new_tokens
    if req.decode is not None:
        want, stop = runner.decode.expected(prompt, n, req.decode, req.eos_token_id)
        return runner.decode.continuation(prompt, n, req.decode), want, None, stop
    continuation, margins = runner.continuation(prompt, n)
    if runner.oracle_shares_engine:  # the engine may hold the oracle's whole memoised continuation
        asked = runner._greedy_memo.get(tuple(prompt))
        runner._seen.append([*prompt, *(asked[1] if asked else continuation)][:-1])
    expected, expected_margins = list(continuation), margins
    stop = "max_new_tokens" if len(continuation) >= n else "context_full"
    if req.eos_token_id is not None and req.eos_token_id in expected:
        cut = expected.index(req.eos_token_id) + 1
        expected = expected[:cut]
        expected_margins = None if margins is None else margins[:cut]
        stop = "eos"
    return continuation, expected, expected_margins, stop


def _call(engine: Any, req: SessionRequest) -> Any:
    """``engine.generate`` for ``req``: with ``decode=`` only where the request has decode parameters (an engine
    that takes none is called as before)."""
    if req.decode is None:
        return engine.generate(list(req.prompt), req.max_new_tokens, eos_token_id=req.eos_token_id)
    return engine.generate(list(req.prompt), req.max_new_tokens, eos_token_id=req.eos_token_id, decode=req.decode)


def replay_session(
    history: SessionHistory,
    *,
    engine_factory: Callable[[], Any],
    greedy: GreedyOracle,
    vocab_size: int,
    tie_tolerance: float = 0.0,
    set_drafter: SetDrafter | None = None,
    reference_factory: Callable[[], Any] | None = None,
    atol: float = 0.0,
    feature_reference_factory: Callable[[], Any] | None = None,
    decode_reference_factory: Callable[[], Any] | None = None,
) -> list[SessionFailure]:
    """Replay ``history`` request by request on a fresh ``engine_factory()``; the failures found (at most one).

    Scripted requests get the same ``ScriptedDrafter`` (same plan, continuation from
    ``greedy``) or the same ``set_drafter`` call as when recorded. The replay stops at
    the first failing request (later requests build on a context it got wrong).
    Pass the same ``reference_factory`` / ``atol`` as the run that recorded the history:
    a failure found by the white-box state check needs it to fail again. Requests with
    ``feature_layers`` install a feature drafter and judge its features again, on fresh
    targets from ``feature_reference_factory`` (default: ``reference_factory``). Requests with ``decode``
    parameters pass them on and are judged against plain decoding with them on a copy of the model from
    ``decode_reference_factory``.
    """
    replay = _Replayer.make(
        history,
        "replay_session()",
        engine_factory=engine_factory,
        greedy=greedy,
        vocab_size=vocab_size,
        tie_tolerance=tie_tolerance,
        set_drafter=set_drafter,
        reference_factory=reference_factory,
        atol=atol,
        feature_reference_factory=feature_reference_factory,
        decode_reference_factory=decode_reference_factory,
    )
    failure = replay(history.requests)
    return [] if failure is None else [failure]


def shrink_history(
    history: SessionHistory,
    *,
    engine_factory: Callable[[], Any],
    greedy: GreedyOracle,
    vocab_size: int,
    tie_tolerance: float = 0.0,
    set_drafter: SetDrafter | None = None,
    reference_factory: Callable[[], Any] | None = None,
    atol: float = 0.0,
    max_replays: int = 200,
    feature_reference_factory: Callable[[], Any] | None = None,
    decode_reference_factory: Callable[[], Any] | None = None,
) -> SessionHistory:
    """A shorter history that still fails on a fresh engine (the history itself when it does not fail).

    Cheap next to Hypothesis's shrinker (which re-runs whole sessions for every choice it
    simplifies): cut after the failing request; drop requests one at a time while the
    replay still fails; then, per request, no EOS and a smaller ``max_new_tokens``. Prompts
    are left as they are (their shared prefixes are what the failure is about). At most
    ``max_replays`` replays, each on a fresh ``engine_factory()``.
    """
    replay = _Replayer.make(
        history,
        "shrink_history()",
        engine_factory=engine_factory,
        greedy=greedy,
        vocab_size=vocab_size,
        tie_tolerance=tie_tolerance,
        set_drafter=set_drafter,
        reference_factory=reference_factory,
        atol=atol,
        feature_reference_factory=feature_reference_factory,
        decode_reference_factory=decode_reference_factory,
    )
    int_at_least(max_replays, name="max_replays", minimum=1, where="shrink_history")
    budget = [max_replays]

    def failing_prefix(requests: Sequence[SessionRequest]) -> list[SessionRequest] | None:
        """The requests up to the one that fails, or None when the replay passes (or the budget is spent)."""
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        failure = replay(requests)
        if failure is None:
            return None
        index = failure.example.get("failing_request")
        return list(requests[: int(index) + 1]) if isinstance(index, int) else list(requests)

    current = failing_prefix(history.requests)
    if current is None:
        return history
    changed = True
    while changed and budget[0] > 0:
        changed = False
        i = len(current) - 2  # latest first: the requests right before the failure matter most
        while i >= 0 and budget[0] > 0:
            candidate = failing_prefix([*current[:i], *current[i + 1 :]])
            if candidate is not None:
                current, changed = candidate, True
            i = min(i - 1, len(current) - 2)
    for i in range(len(current)):
        for simplify in _SIMPLIFICATIONS:
            simpler = simplify(current[i])
            if simpler is None or simpler == current[i]:
                continue
            candidate = failing_prefix([*current[:i], simpler, *current[i + 1 :]])
            if candidate is not None and len(candidate) == len(current):
                current[i] = simpler
    return SessionHistory(
        requests=tuple(_renote(current, replay.continuation, replay.decoded)),
        vocab_size=history.vocab_size if history.vocab_size is not None else vocab_size,
        engine=history.engine,
        failing_request=len(current) - 1,
    )


def _renote(
    requests: Sequence[SessionRequest],
    continuation: Callable[[Sequence[int], int], list[int]],
    decoded: Callable[[SessionRequest], list[int]] | None = None,
) -> list[SessionRequest]:
    """Kinds and notes that say how each request relates to the one before it in the *shrunk* history.

    The recorded kinds and notes describe the original run ("multi_turn" on a user turn, "context 4
    of 6"), which the shrunk history no longer has: a dropped request can make a user turn an edit of
    what now comes before it. Each request is relabelled from its relation to the previous context
    (``relation_of``: the coverage model of requests), the previous context being the previous prompt
    plus its plain-greedy output (what a correct engine emitted); across a ``reset`` the relation is
    to the context before it, and the note says the reset came between.
    """
    out: list[SessionRequest] = []
    previous: list[int] | None = None
    given = 0
    after_reset = False
    for req in requests:
        if req.kind == "reset":
            out.append(attrs.evolve(req, note="the engine forgets its caches"))
            after_reset = previous is not None
            continue
        prompt = list(req.prompt)
        relation = relation_of(previous, prompt, given=given)
        note = RELATION_DESCRIPTIONS[relation]
        if previous is not None and relation not in ("same", "unrelated"):
            common = _shared_prefix(previous, prompt)
            note += f" (shares its first {common} tokens with the previous context: {given} prompt + "
            note += f"{len(previous) - given} output tokens)"
        if after_reset:
            note += ", after reset()"
        out.append(attrs.evolve(req, kind=SESSION_KIND[relation], note=note))
        # a request with decode parameters: what plain decoding with them emits
        output = continuation(prompt, req.max_new_tokens) if decoded is None else decoded(req)
        if req.eos_token_id is not None and req.eos_token_id in output:
            output = output[: output.index(req.eos_token_id) + 1]
        previous, given, after_reset = [*prompt, *output], len(prompt), False
    return out


def _without_eos(req: SessionRequest) -> SessionRequest | None:
    return None if req.kind == "reset" else attrs.evolve(req, eos_token_id=None)


def _budget_to(fraction: float) -> Callable[[SessionRequest], SessionRequest | None]:
    def smaller(req: SessionRequest) -> SessionRequest | None:
        if req.kind == "reset":
            return None
        return attrs.evolve(req, max_new_tokens=int(req.max_new_tokens * fraction))

    return smaller


def _first_planned_round(req: SessionRequest) -> SessionRequest | None:
    return None if req.plan is None else attrs.evolve(req, plan=req.plan[:1])


def _without_features(req: SessionRequest) -> SessionRequest | None:
    return None if req.feature_layers is None else attrs.evolve(req, feature_layers=None)


def _without_decode(req: SessionRequest) -> SessionRequest | None:
    return None if req.decode is None else attrs.evolve(req, decode=None)


# tried in order on each request of a shrunk history, each kept if the replay still fails there
_SIMPLIFICATIONS: tuple[Callable[[SessionRequest], SessionRequest | None], ...] = (
    _without_eos,
    _budget_to(0.0),
    _budget_to(0.5),
    _first_planned_round,
    _without_features,
    _without_decode,
)


class _Replayer:
    """Replays request lists on fresh engines, sharing one greedy memo (shrinking replays the same prompts)."""

    def __init__(self, make_runner: Callable[[], _SessionRunner]) -> None:
        self.make_runner = make_runner
        self._oracle: _SessionRunner | None = None

    def continuation(self, prompt: Sequence[int], n: int) -> list[int]:
        """Plain greedy's first ``n`` tokens after ``prompt`` (from the shared memo)."""
        return self._runner().continuation(prompt, n)[0]

    def decoded(self, req: SessionRequest) -> list[int]:
        """Plain decoding's first tokens for ``req`` with its decode parameters (none: plain greedy's)."""
        if req.decode is None:
            return self.continuation(req.prompt, req.max_new_tokens)
        return self._runner().decode.continuation(req.prompt, req.max_new_tokens, req.decode)

    def _runner(self) -> _SessionRunner:
        if self._oracle is None:
            self._oracle = self.make_runner()
        return self._oracle

    @classmethod
    def make(
        cls,
        history: SessionHistory,
        where: str,
        *,
        engine_factory: Callable[[], Any],
        greedy: GreedyOracle,
        vocab_size: int,
        tie_tolerance: float,
        set_drafter: SetDrafter | None,
        reference_factory: Callable[[], Any] | None,
        atol: float,
        feature_reference_factory: Callable[[], Any] | None = None,
        decode_reference_factory: Callable[[], Any] | None = None,
    ) -> _Replayer:
        if not isinstance(history, SessionHistory):
            raise InvalidSettingError(f"{where}: history must be a SessionHistory, got {type(history).__name__}")
        if not callable(engine_factory) or not callable(greedy):
            raise InvalidSettingError(f"{where}: engine_factory and greedy must be callable")
        if history.vocab_size is not None and history.vocab_size != vocab_size:
            raise UsageError(
                f"{where}: the history was recorded with vocab_size={history.vocab_size}; the engine has {vocab_size}"
            )
        tol = _check_tolerance(tie_tolerance, where)
        state_atol = _check_tolerance(atol, where, name="atol")
        if reference_factory is not None and not callable(reference_factory):
            raise InvalidSettingError(f"{where}: reference_factory={reference_factory!r} must be callable or None")
        if feature_reference_factory is not None and not callable(feature_reference_factory):
            raise InvalidSettingError(
                f"{where}: feature_reference_factory={feature_reference_factory!r} must be callable or None"
            )
        features = feature_reference_factory or reference_factory
        memo: dict[tuple[int, ...], tuple[int, list[int], list[float] | None]] = {}
        ask = max((r.max_new_tokens for r in history.requests), default=0)

        def make_runner() -> _SessionRunner:
            return _SessionRunner(
                engine_factory(),
                greedy=greedy,
                vocab_size=vocab_size,
                tie_tolerance=tol,
                set_drafter=set_drafter,
                memo=memo,
                ask_at_least=ask,
                reference=None if reference_factory is None else reference_factory(),
                atol=state_atol,
                feature_reference=features,
                decode_reference=decode_reference_factory,
            )

        return cls(make_runner)

    def __call__(self, requests: Sequence[SessionRequest]) -> SessionFailure | None:
        runner = self.make_runner()
        for req in requests:
            _, failure = runner.run(req)
            if failure is not None:
                return failure
        return None


def _check_tolerance(value: object, where: str, name: str = "tie_tolerance") -> float:
    return check_tolerance(value, where=where, name=name)
