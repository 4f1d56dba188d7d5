"""The ``session-machine`` driver: one plug-in engine instance serving many requests.

A ``SessionMachine`` sends request after request to one engine (the cache it keeps between
calls is what is tested) and judges each against plain greedy, white-box where the live
target shows its state, and where the engine drafts with a feature drafter (its own declares
``feature_layers``, or the ``--drafter`` subject's layers for an engine that reports features),
most requests install a feature drafter whose handed features are judged at every proposal
against a fresh copy of the model. The database's failing histories are replayed first; a failure's
history is shrunk by replaying it on the reset engine (not by Hypothesis: far cheaper), then
replayed on an engine newly built by the subject's factory: only a history seen to fail there is
saved and named by the reproduce command (``--replay-session FILE``); one that fails only on the
engine that served earlier requests before ``reset()`` is reported as state that survived reset(),
and its reproduce command is the seed-based one (the same search). With ``--decode-state`` half the requests
carry the processors the engine declares (judged against plain decoding with them on the plug-in's model).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from specproof.conformance import _registry as registry
from specproof.conformance._engine_runs import case_greedy
from specproof.conformance._subjects import EngineCase, Suite
from specproof.conformance.drivers._protocol import CheckItem, Driver
from specproof.contract import Violation, ViolationError

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._results import CheckResult

__all__ = ["SessionMachineDriver"]


class SessionMachineDriver(Driver):
    """Sessions on each engine case that keeps a cache between calls."""

    name = "session-machine"

    @classmethod
    def checks(cls, invariant: registry.Invariant, suite: Suite) -> Iterator[CheckItem]:
        for case in suite.engines:
            if invariant.applies(case.exposes()) is None:  # SpecDecoder keeps no cache between calls
                yield CheckItem(invariant, case.id, case)

    def reproduce_args(self, result: CheckResult) -> Sequence[str]:
        replay = self.plan.replay_session or self.context.session_files.get(result.case)
        return ("--replay-session", replay) if replay else ()

    def _judge(self, case: EngineCase) -> dict[str, Any]:
        """What judges a session: the engine factory, plain greedy and, white-box, a reference model."""
        # white-box after every request where the live target shows its state
        white_box = callable(getattr(case.live_target, "state_arrays", None)) and case.make_reference is not None
        # without a reference model the oracle is the engine's own greedy(), on the engine's caches
        shares_engine = case.make_reference is None
        plan, cache = self.plan, self.context.cache
        horizon = plan.profile.max_new_tokens

        def greedy(prompt: Sequence[int], n: int, eos: int | None) -> tuple[list[int], Any]:
            # the same memoized continuations the engine-case search uses; when they come from the
            # engine, all it generated (the horizon), so the prefix-reuse bound credits what it holds
            want = max(n, horizon) if shares_engine else n
            return case_greedy(case, plan.suite.target, list(prompt), want, eos, horizon=horizon, cache=cache)

        greedy.shares_engine = shares_engine  # type: ignore[attr-defined]
        return {
            "feature_reference_factory": _feature_reference(case),
            "engine_factory": case.make_engine,
            "greedy": greedy,
            "vocab_size": case.vocab_size,
            "tie_tolerance": case.tie_tolerance,
            "reference_factory": case.make_reference if white_box else None,
            "atol": case.atol,
            # a request with decode parameters (drawn with --decode-state, or in a replayed history) is judged
            # against plain decoding with them on a copy of the plug-in's model
            "decode_reference_factory": case.make_reference,
        }

    def run(self, item: CheckItem, result: CheckResult) -> None:
        from specproof.strategies import (
            SessionFailure,
            SessionHistory,
            SessionMachine,
            release_machine,
            replay_session,
            shrink_history,
        )

        case = item.engine
        assert case is not None and case.make_engine is not None
        judge = self._judge(case)
        if self.plan.replay_session is not None:
            history = SessionHistory.load(self.plan.replay_session)
            result.examples = result.exercised = 1
            failures = replay_session(history, **judge)
            if failures:
                raise ViolationError(_session_violations(item, failures))
            return
        self._replay_histories(item, judge, result)
        profile = self.plan.profile
        machine = SessionMachine.configure(
            **judge,
            feature_layers=case.feature_layers,
            max_context=case.max_context,
            max_prompt=profile.max_prompt,
            max_new_tokens=min(profile.max_new_tokens, 16),
            stateful_step_count=profile.stateful_steps,
            decode_features=self._decode_features(case),
        )

        class Counted(machine):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                result.examples += 1
                result.exercised += 1
                super().__init__()

        try:
            # Hypothesis' shrinking of a request sequence replays whole sessions (7-9 s at quick);
            # shrink_history replays the found history on fresh engines instead (well under a second)
            toured = Counted.toured()  # (made before the run, which releases Counted's configuration)
            self.context.replay.run_machine(Counted, item, shrink=False)
            if not all(machine.relations_reached().values()):
                _tour(toured)  # one example touring every relation the run left unreached
            else:
                release_machine(toured)
        except SessionFailure as exc:
            _note_unjudged_reuse(machine, result)
            _note_features(machine, result)
            _note_relations(machine, result)
            history = SessionHistory.from_example(exc.example, vocab_size=case.vocab_size)
            history = attrs.evolve(history, engine=self.plan.specs.get("engine"))
            shorter = shrink_history(history, **judge)  # on the reset instance (cheap: no engine is built)
            failures = self._reproducible(item, shorter, judge, save=True) or [_unreplayable(exc)]
            raise ViolationError(_session_violations(item, failures)) from exc
        _note_unjudged_reuse(machine, result)
        _note_features(machine, result)
        _note_relations(machine, result)
        _note_decode(machine, result)

    def _decode_features(self, case: EngineCase) -> frozenset[str]:
        """With ``--decode-state``, the processors the case declares (none without a model to decode plainly
        with); without it none: the session's draws are unchanged."""
        from specproof.conformance.drivers._case_decode import case_processor_features

        if not self.plan.decode_state or case.make_reference is None:
            return frozenset()
        return case_processor_features(case)

    def _replay_histories(self, item: CheckItem, judge: dict[str, Any], result: CheckResult) -> None:
        """Replay the failing session histories the database holds for this check (before any search)."""
        replay = self.context.replay
        for history, raw in replay.histories(item):
            result.examples += 1
            result.exercised += 1
            failures = self._reproducible(item, history, judge, save=False)
            if failures:
                self.plan.database.replayed[item.id] += 1
                raise ViolationError(_session_violations(item, failures))
            replay.forget_history(item, raw)

    def _reproducible(self, item: CheckItem, history: Any, judge: dict[str, Any], *, save: bool) -> list[Any]:
        """The failures of ``history`` replayed on the reset instance, and where they also fail on a newly
        built engine (what ``--replay-session`` replays on), the history kept as the file the reproduce line
        names (``save``: in the database too). A reproduce line is only printed for a replay seen to fail:
        a history that fails only on the instance after reset() is a failure of its own (state survived
        reset()), reproduced by the seed-based command (the same search), not by the file."""
        from specproof.strategies import replay_session

        case = item.engine
        assert case is not None
        failures = replay_session(history, **judge)
        if not failures:
            return []
        fresh = _on_new_engine(case, history, judge)
        if fresh is None:  # no engine apart from the instance can be built: the file is not seen to reproduce
            return [_reword(f, _UNVERIFIED) for f in failures]
        if not fresh:
            return [_reword(f, _SURVIVED_RESET) for f in failures]
        replay = self.context.replay
        self.context.session_files[case.id] = replay.save_history(history, item if save else None)
        return fresh


_SURVIVED_RESET = (
    "state survived reset(): the history below fails only on an engine that served earlier requests before "
    "reset() (replayed on a newly built engine, it passes), so `--replay-session` cannot reproduce it; "
    "the seed-based command (the same search) does — "
)
_UNVERIFIED = (
    "(the history below fails on the engine after reset(); no engine apart from that instance could be built "
    "to confirm it fails on a new one, so the reproduce line is the seed-based command) "
)


def _reword(failure: Any, prefix: str) -> Any:
    """The same failure (expected, actual, history) with ``prefix`` before its explanation."""
    from specproof.strategies import SessionFailure

    return SessionFailure(
        prefix + failure.explanation, expected=failure.expected, actual=failure.actual, example=failure.example
    )


def _unreplayable(failure: Any) -> Any:
    """A search's failure whose (shrunk) history passes when replayed alone: it depended on earlier examples."""
    return _reword(
        failure,
        "the failing history passes when replayed alone, on the engine after reset(): it fails only after "
        "the earlier examples of the search ran on the same engine (state survived reset(), or the engine "
        "is nondeterministic); the seed-based command (the same search) reproduces it — ",
    )


def _on_new_engine(case: EngineCase, history: Any, judge: dict[str, Any]) -> list[Any] | None:
    """The failures of ``history`` replayed on an engine newly built by the subject's factory (closed
    after); None when the factory gives back the instance itself, or cannot build another one."""
    from specproof.strategies import replay_session

    if case.build_engine is None:
        return None
    try:
        engine = case.build_engine()
    except Exception:
        return None
    if engine is case.engine:
        return None
    try:
        return replay_session(history, **{**judge, "engine_factory": lambda: engine})
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()


def _note_unjudged_reuse(machine: Any, result: CheckResult) -> None:
    """A note on the result when a declared cache's reuse went unjudged (it reported no ``prefix_reused``)."""
    from specproof.strategies import REUSE_UNREPORTED

    unreported = machine.observed[REUSE_UNREPORTED]
    if unreported:
        result.notes.append(
            f"prefix reuse not judged on {unreported} request(s): the engine declares a cache (`sessions` / "
            "reuses_prefix) but its stats do not report prefix_reused, which specproof-engine/1 added after it "
            "was published; its tokens were judged (docs/protocol.md, Compatibility)"
        )
        # the table's detail column (a failure's own detail replaces it)
        result.detail = (
            result.detail or "prefix reuse not judged: no stats.prefix_reused (docs/protocol.md, Compatibility)"
        )


def _feature_reference(case: EngineCase) -> Any:
    """Fresh copies of the model to judge a feature drafter's features with: where the engine drafts with
    one (its own drafter declares ``feature_layers``, or the case's ``--drafter`` subject's) and the model
    computes features (``forward_with_features``); None otherwise (no feature drafter is installed)."""
    from specproof.strategies import feature_layers_of

    make = case.make_reference
    if make is None or (feature_layers_of(case.own_drafter) is None and case.feature_layers is None):
        return None
    return make if callable(getattr(make(), "forward_with_features", None)) else None


def _note_features(machine: Any, result: CheckResult) -> None:
    """What the feature judge exercised, as a note (nothing when no feature drafter was installed)."""
    requests, proposals, hits = machine.features_judged()
    if requests:
        result.notes.append(
            f"features judged at {proposals} proposal(s) of {requests} request(s) with a feature drafter, "
            f"{hits} of them on a prefix the engine served from its caches"
        )


def _note_decode(machine: Any, result: CheckResult) -> None:
    """How many requests carried decode parameters, and how many of them the engine refused (nothing with
    ``--decode-state`` off, or where the engine declares no processor)."""
    from specproof.strategies import DECODE_REFUSED, DECODE_TAG

    drawn, refused = machine.observed[DECODE_TAG], machine.observed[DECODE_REFUSED]
    if drawn:
        result.notes.append(
            f"decode processors on {drawn} request(s), judged against plain decoding with them"
            + (f"; the engine refused {refused} of them" if refused else "")
        )


def _tour(machine: Any) -> None:
    """One derandomized example of ``machine`` (a toured session), unshrunk and unsaved: what it reaches is
    counted in the configured machine's ``observed``; a failure raises as the search's would."""
    import hypothesis
    from hypothesis.stateful import run_state_machine_as_test

    from specproof.strategies import release_machine

    settings = hypothesis.settings(
        max_examples=1,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    try:
        run_state_machine_as_test(machine, settings=settings)
    finally:
        release_machine(machine)


def _note_relations(machine: Any, result: CheckResult) -> None:
    """The requests by their relation to the one before (every applicable relation listed, 0 = never reached:
    the check is then inconclusive). The engine's ``k`` is its own, so the k relations do not apply."""
    result.relations.update(machine.relations_reached())


def _session_violations(item: CheckItem, failures: Sequence[Any]) -> list[Violation]:
    """The session machine's failures (``SessionFailure``) as violations of the check's invariant."""
    return [
        item.invariant.violation(f.explanation, expected=f.expected, actual=f.actual, example=f.example)
        for f in failures
    ]
