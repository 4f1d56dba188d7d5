"""The certify core: a resolved plan, the checks derived from the registry, and their drivers.

- ``Plan`` — what is certified, how hard, with which tolerances (plain data, resolved once);
- ``Certification`` — the checks the plan selects (one per registry entry and subject case)
  and the drivers that run them: an example search per drafter/target invariant, **one
  search per engine case** feeding every engine invariant (searched again per invariant
  only to shrink a failure), the rollback machine and the session machine;
- results are ``CheckResult`` records; the pytest plugin and ``certify()`` only glue these
  into pytest, and ``reports`` renders them.
"""

from __future__ import annotations

import re
import time
import unittest
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import hypothesis
from hypothesis import Phase
from hypothesis import strategies as st
from hypothesis.database import MultiplexedDatabase, choices_to_bytes
from hypothesis.internal.reflection import function_digest

from specproof.conformance import _registry as registry
from specproof.conformance._database import check_key, derandomized_seed, replay_only, shortlex
from specproof.conformance._harness import (
    PATHS,
    EngineRun,
    HostileDrafter,
    RunCache,
    greedy_continuation,
    run_builtin,
    run_plugin,
)
from specproof.conformance._profiles import Profile, get_profile
from specproof.conformance._results import CheckResult
from specproof.conformance._run import Capabilities
from specproof.conformance._subjects import EngineCase, Suite
from specproof.conformance.checks.features import feature_layers_of
from specproof.contract import SpecproofError, UsageError, Violation, ViolationError, validate_tolerance
from specproof.engine._plugins import plugin_directory
from specproof.strategies import PlannedRound, RoundPlan, ScriptedDrafter, contexts, round_plans

__all__ = ["OWN_DRAFT_PATHS", "Certification", "CheckItem", "Plan"]

_DIGEST_KEY_ENV = "SPECPROOF_WIRE_DIGEST_KEY"  # (specproof.wire's name: conformance does not import it here)
_DIGEST_KEY = re.compile(r"\$SPECPROOF_WIRE_DIGEST_KEY=([0-9a-f]{32})\b")
_COVERING_KEY = b"covering"  # the Hypothesis key the covering replay asks its read-only database for

# The rollback paths an engine judged on its own drafts (no suite_drafts) must reach for a PASS:
# the suite cannot drive it there, so a path it never took is a path nobody checked
# (docs/contract.md, "Engines").
OWN_DRAFT_PATHS: tuple[str, ...] = ("all_accepted", "partial", "rejected_at_0", "eos_in_accepted")


@attrs.frozen(kw_only=True)
class Plan:
    """Resolved subjects, profile, seed, tolerances and selection: everything a run depends on."""

    suite: Suite
    profile: Profile
    seed: int | None
    only: tuple[str, ...]
    specs: dict[str, str | None]
    tie_tolerance: float | None
    atol: float | None
    replay_session: str | None = None  # a specproof-session/1 file: engine.session replays it instead of searching
    max_context: int | None = None  # --max-context: the capacity an engine is tested at (default: the profile's)
    storage: str | None = None  # where a failing session's history is saved (default ~/.cache/specproof)
    # the example database (an ExampleStore, _database.py): failures are saved and replayed first
    database: Any = attrs.field(default=None, eq=False)
    expected_failures: dict[str, str] = attrs.field(factory=dict)  # invariant id -> reason (--expect-fail)

    @classmethod
    def create(
        cls,
        subject: str | None = None,
        *,
        drafter: str | None = None,
        target: str | None = None,
        engine: str | None = None,
        profile: str = "quick",
        seed: int | None = None,
        tie_tolerance: float | None = None,
        atol: float | None = None,
        only: tuple[str, ...] = (),
        replay_session: str | None = None,
        storage: str | None = None,
        max_context: int | None = None,
        database: Any = None,
        expected_failures: Mapping[str, str] | None = None,
    ) -> Plan:
        """Validate every option before anything is built; bad input is a ``UsageError``."""
        prof = get_profile(profile)
        selected = registry.select(only)
        expected = {registry.get(i).id: str(r) for i, r in (expected_failures or {}).items()}
        try:
            tie = None if tie_tolerance is None else validate_tolerance(tie_tolerance, name="--tie-tolerance")
            tol = None if atol is None else validate_tolerance(atol, name="--atol")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)):
            raise UsageError(f"--max-context must be an integer, got {max_context!r}")
        if max_context is not None and max_context < 2:
            raise UsageError(f"--max-context must be at least 2 (a prompt and a pending token), got {max_context}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise UsageError(f"--seed must be an integer, got {seed!r}")
        if subject is None:
            subject = (
                "engine"
                if engine
                else "drafter"
                if drafter and not target
                else "target"
                if target and not drafter
                else "all"
            )
        if replay_session is not None:
            from specproof.strategies import SessionHistory

            SessionHistory.load(replay_session)  # a bad file is a usage error before anything runs
            if not engine:
                raise UsageError("--replay-session replays a request history on an engine: give --engine")
        if subject in ("drafter", "target") and engine:
            raise UsageError(f"certify {subject} takes no --engine (an engine is certified with `certify engine`)")
        suite = Suite.from_specs(
            subject,  # type: ignore[arg-type]
            drafter=drafter,
            target=target,
            engine=engine,
            tie_tolerance=tie,
            atol=tol,
        )
        _bound_capacity(suite, prof, max_context)
        return cls(
            suite=suite,
            profile=prof,
            seed=seed,
            only=selected,
            specs={"drafter": drafter, "target": target, "engine": engine, "subject": subject},
            tie_tolerance=tie,
            atol=tol,
            replay_session=replay_session,
            storage=storage,
            max_context=max_context,
            database=database,
            expected_failures=expected,
        )


def _bound_capacity(suite: Suite, profile: Profile, max_context: int | None) -> None:
    """Each engine case's tested capacity: its max_context, bounded by --max-context or the profile;
    a bound below max_context is noted on the certificate (paths at max_context were not reached)."""
    bound, source = (
        (max_context, f"--max-context {max_context}")
        if max_context is not None
        else (profile.max_capacity, f"the {profile.name} profile's capacity of {profile.max_capacity} tokens")
    )
    for case in suite.engines:
        declared = case.max_context
        if declared is None and case.kind == "builtin" and suite.target is not None:
            declared = suite.target.max_context
        if declared is None:
            continue
        case.capacity = min(declared, bound)
        if case.capacity < declared:
            case.notes.append(
                f"capacity tested: contexts up to {case.capacity} tokens ({source}); the engine declares "
                f"max_context={declared}, so the paths at max_context (a round clamped by the context, "
                f"stop_reason context_full) were NOT exercised at {declared}; --max-context N sets the capacity"
            )


@attrs.frozen
class CheckItem:
    """One check to run: a registry entry on one subject case (pytest id: ``case-invariant``)."""

    invariant: registry.Invariant
    case_id: str
    engine: EngineCase | None = attrs.field(default=None, eq=False)

    @property
    def id(self) -> str:
        return f"{self.case_id}-{self.invariant.id}" if self.invariant.subject == "engine" else self.invariant.id


class _DrafterCase:
    """What drafter invariants run on: fresh drafters and the vocabulary they draft from."""

    def __init__(self, make: Callable[[], Any], vocab_size: int) -> None:
        self.make = make
        self.vocab_size = vocab_size

    def exposes(self) -> Capabilities:
        """What the drafter declares: a feature drafter's layers and the target whose features it reads."""
        drafter = self.make()
        spec = getattr(drafter, "feature_target_spec", None)
        has = set()
        if feature_layers_of(drafter) is not None:
            has.add("feature_layers")
        if isinstance(spec, str) and spec:
            has.add("feature_target_spec")
        return Capabilities(
            has=has,
            why_not={
                "feature_layers": "not a feature drafter (it declares no feature_layers)",
                "feature_target_spec": "the feature drafter names no feature_target_spec to compute its features with",
            },
        )


@attrs.define
class _CaseSearch:
    """The one search of an engine case: every example's run, in the order drawn."""

    runs: list[EngineRun] = attrs.Factory(list)
    seconds: float = 0.0
    error: BaseException | None = None
    covering: list[tuple[EngineRun, bytes]] = attrs.Factory(list)  # replayed covering examples, as saved


class Certification:
    """The checks a plan selects and the drivers that run them; results by check id."""

    def __init__(self, plan: Plan, *, on_result: Callable[[CheckResult], None] | None = None) -> None:
        """``on_result`` is called with each check's result as it finishes (progress for the CLI)."""
        self.plan = plan
        self.on_result = on_result
        # Inside a pytest run a check executes under pytest's output capture, where a progress line
        # would be swallowed: the plugin sets this and hands the results on after each test.
        self.defer_results = False
        self._finished: list[CheckResult] = []
        self.cache = RunCache()  # runs, greedy continuations and judges: this certification's only
        self.results: dict[str, CheckResult] = {}
        self.started = time.perf_counter()
        self.interrupted = False
        self._searches: dict[int, _CaseSearch] = {}
        self._sink: list[EngineRun] | None = None  # the runs a database replay draws
        self._choices: list[tuple[EngineRun, bytes]] | None = None  # runs drawn, with their choice sequences
        self.session_files: dict[str, str] = {}  # case id -> the saved history of its failing session

    # ---- what runs ---------------------------------------------------------------------

    def checks(self, subject: registry.Subject) -> list[CheckItem]:
        """The checks of one area, derived from the registry, the suite and ``--only``."""
        suite, only = self.plan.suite, self.plan.only
        items: list[CheckItem] = []
        for inv in registry.by_subject(subject):
            if only and inv.id not in only:
                continue
            if subject == "drafter" and suite.certify_drafter:
                items.append(CheckItem(inv, "drafter"))
            elif subject == "target" and suite.certify_target:
                items.append(CheckItem(inv, "target"))
            elif subject == "engine":
                builtin = [c for c in suite.engines if c.kind == "builtin"]
                for case in suite.engines:
                    if inv.driver == "rollback-machine":
                        # one machine drives the built-in decoder with every rollback strategy (drawn per
                        # conversation): half the cost of a machine per strategy, the same rules. It drafts
                        # with its own script, so it says nothing about a drafter under certification.
                        if builtin and case is builtin[0] and suite.subject != "drafter":
                            items.append(CheckItem(inv, "+".join(c.id for c in builtin), case))
                        continue
                    if inv.driver == "session-machine" and inv.applies(case.exposes()) is not None:
                        continue  # SpecDecoder keeps no cache between calls (DecodeSession: rollback machine)
                    items.append(CheckItem(inv, case.id, case))
        return items

    def all_checks(self) -> list[CheckItem]:
        return [*self.checks("drafter"), *self.checks("target"), *self.checks("engine")]

    # ---- running -----------------------------------------------------------------------

    def run(self, item: CheckItem) -> CheckResult:
        """Run one check to its verdict (never raises for a verdict; KeyboardInterrupt propagates)."""
        inv = item.invariant
        result = CheckResult(nodeid=item.id, invariant=inv.id, case=item.case_id)
        self.results[item.id] = result
        start = time.perf_counter()
        try:
            if inv.driver == "examples":
                self._run_examples(item, result)
            elif inv.driver == "engine-case":
                self._run_engine_invariant(item, result)
            elif inv.driver == "rollback-machine":
                self._run_rollback_machine(item, result)
            else:
                self._run_session_machine(item, result)
        except ViolationError as exc:
            result.fail(exc.violations)
        except KeyboardInterrupt:
            result.status = "error"
            result.detail = "interrupted"
            self.interrupted = True
            raise
        except Exception as exc:
            group = getattr(exc, "exceptions", None)  # Hypothesis' FlakyFailure: failed, then passed on replay
            if isinstance(group, tuple) and group and all(isinstance(e, ViolationError) for e in group):
                result.fail([v for e in group for v in e.violations])
                result.detail = "flaky: " + result.detail
            else:
                result.status = "error"
                result.detail = f"{type(exc).__name__}: {exc}"
        finally:
            result.seconds = time.perf_counter() - start
        if result.status == "pending":
            result.settle()
        if result.status in ("fail", "error"):
            result.reproduce = self.reproduce_command(result)
        reason = self.plan.expected_failures.get(inv.id)
        if reason is not None:
            result.expect_failure(reason)
        if self.on_result is not None:
            if self.defer_results:
                self._finished.append(result)
            else:
                self.on_result(result)
        return result

    def hand_on_results(self) -> None:
        """Give ``on_result`` the results deferred while a check ran under pytest's capture."""
        finished, self._finished = self._finished, []
        if self.on_result is not None:
            for result in finished:
                self.on_result(result)

    def _settings(
        self,
        fn: Any,
        *,
        max_examples: int | None = None,
        item: CheckItem | None = None,
        phases: Any = None,
        replay: Sequence[bytes] = (),
    ) -> Any:
        """Profile settings; with a database, the check's own namespace and Phase.reuse first
        (``replay``: choice sequences replayed first too, without being saved there)."""
        database = self._view(item)
        if database is not None and replay:
            key = function_digest(fn.hypothesis.inner_test)  # the key Hypothesis reads the test's entries at
            database = MultiplexedDatabase(database, replay_only(key, replay))
        settings = self.plan.profile.hypothesis_settings(
            seed=self.plan.seed, max_examples=max_examples, database=database
        )
        if phases is not None:
            settings = hypothesis.settings(settings, phases=phases)
        seed = self.plan.seed
        if seed is None and database is not None:
            seed = derandomized_seed(fn)  # what derandomize=True would draw; it cannot be combined with a database
        if seed is not None:
            fn = hypothesis.seed(seed)(fn)  # (@seed sets database=None: the settings go on after it)
        return settings(fn)

    def _key(self, item: CheckItem) -> str | None:
        """The example-database namespace of a check: subjects, invariant, tolerances and profile."""
        return self._namespace(item.invariant.id, item.case_id, item.engine)

    def _namespace(self, invariant: str, case_id: str, case: EngineCase | None) -> str | None:
        if self.plan.database is None:
            return None
        return check_key(
            invariant=invariant,
            case=case_id,
            specs={k: self.plan.specs.get(k) for k in ("drafter", "target", "engine")},
            tolerances=[self.plan.tie_tolerance, self.plan.atol],
            case_tolerances=[case.tie_tolerance, case.atol] if case is not None else None,
            profile=self.plan.profile.name,
            max_context=self.plan.max_context,
        )

    def _view(self, item: CheckItem | None) -> Any:
        store, key = self.plan.database, None if item is None else self._key(item)
        return None if store is None or key is None else store.view(key, check=item.id)  # type: ignore[union-attr]

    def _case(self, item: CheckItem) -> Any:
        suite = self.plan.suite
        if item.invariant.subject == "drafter":
            assert suite.drafter is not None
            vocab = suite.target.vocab_size if suite.target else 256
            return _DrafterCase(suite.drafter.make, vocab)
        assert suite.target is not None
        return suite.target

    def _run_examples(self, item: CheckItem, result: CheckResult) -> None:
        inv, case, profile = item.invariant, self._case(item), self.plan.profile
        why = inv.applies(case.exposes())  # what the subject exposes decides what applies
        if why is not None:
            result.skip(why)
            return
        assert inv.draw is not None and inv.check is not None
        notes: list[str] = []

        @hypothesis.given(data=st.data())
        def search(data: st.DataObject) -> None:
            result.examples += 1
            outcome = inv.check(case, inv.draw(data, case, profile))  # type: ignore[misc]
            result.exercised += outcome.exercised
            if outcome.note:
                notes.append(outcome.note)
            if outcome.violations:
                raise ViolationError(outcome.violations)

        n = profile.capacity_examples if inv.budget == "capacity" else None
        self._settings(search, max_examples=n, item=item)()
        if not result.exercised:
            result.skip(notes[0] if notes else "no example reached this check")

    # ---- engine cases: one search feeds every invariant --------------------------------

    def _draw_run(self, data: st.DataObject, case: EngineCase) -> EngineRun:
        """Draw one example for an engine case and run it (cached: the shrink searches reuse runs)."""
        run = self._draw_one(data, case)
        if self._sink is not None:
            self._sink.append(run)
        if self._choices is not None:
            # every draw of the example is made: its choices replay it (a covering example)
            self._choices.append((run, choices_to_bytes(data.conjecture_data.choices)))
        return run

    def _draw_one(self, data: st.DataObject, case: EngineCase) -> EngineRun:
        profile, suite = self.plan.profile, self.plan.suite
        cap: int | None
        if case.kind == "builtin":
            assert suite.target is not None
            vocab, cap = suite.target.vocab_size, suite.target.max_context
            k = data.draw(st.integers(0, 8), label="k")
        else:
            vocab, cap = case.vocab_size, case.capacity
            k = case.k if case.k is not None else 4
        # max_new_tokens = 0 is a valid request (docs/contract.md, the decode convention): drawn too
        n = data.draw(st.integers(0, profile.max_new_tokens), label="max_new_tokens")
        if case.kind == "builtin" and case.capacity is not None:
            cap = case.capacity
        max_prompt = max(1, min(profile.max_prompt, cap - 1)) if cap is not None else profile.max_prompt
        # a prompt ending near the tested capacity (none when the engine declares no max_context)
        near_end = cap is not None and (
            cap <= 4 * profile.max_prompt or data.draw(st.integers(0, 23), label="near max_context") == 0
        )
        if near_end and cap is not None and data.draw(st.booleans(), label="prompt ends near max_context"):
            room = data.draw(st.integers(1, max(1, min(10, cap - 1))), label="free context slots")
            unit = data.draw(contexts(vocab, min_size=1, max_size=6), label="prompt unit")
            prompt = [unit[i % len(unit)] for i in range(max(1, cap - room))]
        else:
            prompt = data.draw(contexts(vocab, min_size=1, max_size=max_prompt), label="prompt")
        continuation, _ = self._greedy(case, prompt, n, None)
        eos_kind = data.draw(st.sampled_from(["none", "last block", "anywhere"]), label="eos placement")
        eos: int | None = None
        if eos_kind == "last block" and continuation:
            # EOS among the last k+1 greedy tokens before the budget: inside the last accepted block
            eos = data.draw(st.sampled_from(continuation[-(k + 1) :]), label="eos_token_id")
        elif eos_kind == "anywhere" and continuation:
            eos = data.draw(st.sampled_from(continuation), label="eos_token_id")
        scripted_ok = vocab >= 2 and (case.kind == "builtin" or case.takes_drafter)
        kind = data.draw(st.sampled_from(["scripted", "subject"]), label="drafter") if scripted_ok else "subject"
        plan = data.draw(round_plans(k=k, max_rounds=8), label="round plan") if kind == "scripted" else None
        hostile: tuple[str, int, int] | None = None
        if plan is not None and case.kind == "plugin":
            # the hostile-drafter rule: now and then a draft longer than k or out of range
            mode = data.draw(st.sampled_from([None] * 6 + list(HostileDrafter.MODES)), label="hostile drafts")
            if mode is not None:
                extra = data.draw(st.integers(1, 3), label="hostile extra tokens")
                hostile = (mode, extra, data.draw(st.integers(0, 3), label="hostile from call"))
        return self._execute(case, prompt=prompt, k=k, n=n, eos=eos, plan=plan, hostile=hostile)

    def _greedy(self, case: EngineCase, prompt: list[int], n: int, eos: int | None) -> tuple[list[int], Any]:
        if case.kind == "builtin":
            t = self.plan.suite.target
            assert t is not None
            return greedy_continuation(
                t.make,
                None,
                ("target", t.spec),
                prompt,
                n,
                eos,
                horizon=self.plan.profile.max_new_tokens,
                cache=self.cache,
            )
        return greedy_continuation(
            case.make_reference,
            case.greedy_fn,
            ("plugin", case.token),
            prompt,
            n,
            eos,
            horizon=self.plan.profile.max_new_tokens,
            cache=self.cache,
        )

    def _execute(
        self,
        case: EngineCase,
        *,
        prompt: list[int],
        k: int,
        n: int,
        eos: int | None,
        plan: RoundPlan | None,
        hostile: tuple[str, int, int] | None = None,
    ) -> EngineRun:
        suite, horizon = self.plan.suite, self.plan.profile.max_new_tokens
        drafter: Any = None
        script = None
        if plan is not None:
            continuation, _ = self._greedy(case, prompt, n, None)
            drafter = ScriptedDrafter(prompt, continuation, plan, vocab_size=case.vocab_size or 2)
            script = plan.describe()
            if hostile is not None:
                mode, extra, start = hostile
                longer, _ = self._greedy(case, prompt, n + k + extra, None)
                drafter = HostileDrafter(
                    drafter, prompt, longer, mode=mode, extra=extra, start=start, vocab_size=case.vocab_size or 2
                )
                script += f" hostile={mode}+{extra} from call {start}"
        if case.kind == "builtin":
            t, d = suite.target, suite.drafter
            assert t is not None and d is not None
            subject = d.make()
            # a feature drafter's layers: the engine hands features to it, or to the scripted drafter in its place
            layers = feature_layers_of(subject)
            if layers is not None and not set(layers) <= set(getattr(t.prototype, "feature_layers", ())):
                layers = None
            return run_builtin(
                make_target=t.make,
                drafter=drafter if drafter is not None else subject,
                feature_layers=layers,
                drafter_kind=f"scripted:{d.name}" if drafter is not None else f"subject:{d.name}",
                prompt=prompt,
                k=k,
                rollback=case.rollback or "replay",
                max_new_tokens=n,
                eos=eos,
                atol=case.atol,
                tie_tolerance=case.tie_tolerance,
                cache_key=("target", t.spec, d.spec),
                horizon=horizon,
                cache=self.cache,
                capabilities=case.exposes(),
                script=script,
            )
        return run_plugin(
            case,
            prompt=prompt,
            max_new_tokens=n,
            eos=eos,
            drafter=drafter,
            drafter_kind="scripted" if drafter is not None else "engine's own",
            atol=case.atol,
            tie_tolerance=case.tie_tolerance,
            horizon=horizon,
            cache=self.cache,
            script=script,
        )

    def _explicit(self, case: EngineCase) -> list[dict[str, Any]]:
        """Hand-picked examples for the known-hard paths, run before the search on every profile."""
        suite = self.plan.suite
        vocab = case.vocab_size or (suite.target.vocab_size if suite.target else 0)
        if vocab < 2 or not (case.kind == "builtin" or case.takes_drafter):
            return []
        k = case.k if case.kind == "plugin" and case.k is not None else 3
        if k < 2:
            return []
        full, empty = PlannedRound(draft_length=k, correct=k), PlannedRound(draft_length=0, correct=0)
        partial, zero = PlannedRound(draft_length=k, correct=1), PlannedRound(draft_length=k, correct=0)
        prompt = [i % vocab for i in (1, 2, 3, 1, 2)]
        out = [
            # a full accept, then an empty draft right after it (stale state after a zero-draft step)
            {"prompt": prompt, "k": k, "n": 4 * (k + 1), "plan": RoundPlan((full, empty, partial, zero)), "eos": None},
            # a partial accept and a rejection at 0 (rollback into the middle of a draft, and to the base)
            {"prompt": prompt, "k": k, "n": 3 * (k + 1), "plan": RoundPlan((partial, zero, full)), "eos": None},
        ]
        cap = case.capacity or (suite.target.max_context if suite.target else None)
        # At quick, the built-in decoder meets max_context in the rollback machine (a third of its
        # conversations end there); a long prefill per case is what the developer loop cannot afford.
        builtin_at_quick = case.kind == "builtin" and self.plan.profile.name == "quick"
        if cap is not None and cap > k + 3 and not builtin_at_quick:
            # a prompt that ends within k + 1 of max_context: the round bound is clamped by the context
            out.append(
                {
                    "prompt": [prompt[i % len(prompt)] for i in range(cap - 2)],
                    "k": k,
                    "n": 4,
                    "plan": RoundPlan((full, partial)),
                    "eos": None,
                }
            )
        continuation, _ = self._greedy(case, prompt, 2 * (k + 1), None)
        if len(continuation) > k:
            # EOS inside the last fully accepted block, before the length cap
            eos = continuation[-k]
            if eos not in continuation[:-k]:
                out.append({"prompt": prompt, "k": k, "n": 2 * (k + 1), "plan": RoundPlan((full,)), "eos": eos})
        crossing = self._cap_crossing_eos(continuation, prompt=prompt, k=k, full=full, empty=empty)
        if crossing is not None:
            out.append(crossing)
        if case.kind == "plugin":
            # the hostile-drafter rule: a draft longer than k, and one with an id outside the vocabulary
            n = 2 * (k + 1)
            for hostile in (("overlong", 2, 0), ("out_of_range", 1, 0)):
                out.append(
                    {"prompt": prompt, "k": k, "n": n, "plan": RoundPlan((full,)), "eos": None, "hostile": hostile}
                )
        return out

    @staticmethod
    def _cap_crossing_eos(
        continuation: list[int], *, prompt: list[int], k: int, full: PlannedRound, empty: PlannedRound
    ) -> dict[str, Any] | None:
        """A speculative block that reaches ``max_new_tokens`` with EOS inside the budget, past its first token.

        The EOS is the first occurrence of a greedy token at position ``p + 1``; rounds of
        full accepts and empty drafts bring the context to ``p``; the budget is ``p + 3``, so
        the last round drafts two tokens (the second is EOS) and its block ``[t, EOS, bonus]``
        ends exactly at the cap. An engine that does not bound its draft by the budget
        verifies a longer block that crosses it; one that cuts such a block at the cap, or
        scans only the block's first or last token for EOS, emits past the EOS. A correct
        engine stops at the EOS with one token of budget left.
        """
        if k < 2:
            return None
        end = min(len(continuation) - 1, 2 * (k + 1))
        firsts = [q for q in range(1, end) if continuation[q] not in continuation[:q]]
        if not firsts:
            return None
        p = firsts[-1] - 1
        whole, rest = divmod(p, k + 1)
        rounds = (full,) * whole + (empty,) * rest + (full,)
        return {"prompt": prompt, "k": k, "n": p + 3, "plan": RoundPlan(rounds), "eos": continuation[p + 1]}

    def _search(self, case: EngineCase) -> _CaseSearch:
        found = self._searches.get(case.token)
        if found is not None:
            return found
        found = self._searches[case.token] = _CaseSearch()
        start = time.perf_counter()
        try:
            self._replay(case, found)
            for ex in self._explicit(case):
                found.runs.append(self._execute(case, **ex))

            @hypothesis.given(data=st.data())
            def search(data: st.DataObject) -> None:
                found.runs.append(self._draw_run(data, case))

            saving = self.plan.seed is not None and self.plan.database is not None
            self._choices = [] if saving else None
            try:
                self._settings(search)()
            finally:
                drawn, self._choices = self._choices or [], None
            if saving:
                self._keep_covering(case, drawn)
            else:
                self._replay_covering(case, found)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            found.error = exc
        found.seconds = time.perf_counter() - start
        return found

    # ---- covering examples: rare paths a seeded run reached, replayed by derandomized ones ----

    def _case_view(self, case: EngineCase) -> Any:
        key = self._namespace("(engine case search)", case.id, case)
        return None if key is None else self.plan.database.view(key, check=f"{case.id} search")

    def _keep_covering(self, case: EngineCase, drawn: list[tuple[EngineRun, bytes]]) -> None:
        """A seeded search keeps, per rollback path, the smallest example of its own that reached it.

        (Only seeded runs save: a derandomized run draws the same examples every time, so what
        it reaches it reaches anyway, and its database stays as the campaigns left it.)
        """
        view = self._case_view(case)
        for path in PATHS:
            reached = [raw for run, raw in drawn if run.paths[path]]
            if reached and view.keep_covering(path, min(reached, key=shortlex)):
                self.plan.database.covering_saved[case.id] += 1

    def _replay_covering(self, case: EngineCase, found: _CaseSearch) -> None:
        """After a derandomized search: replay the covering examples of the paths it did not reach.

        A path the search reached costs nothing; each unreached one costs its one saved example.
        Replayed with Phase.reuse only, through a read-only database: a covering example that
        passes is kept (Hypothesis would delete it), one that fails feeds the invariants as any
        other run does, and is shrunk from its saved choices (``_shrink``).
        """
        store = self.plan.database
        if found.error is not None or store is None or not store.replay_covering:  # --db-replay failures
            return
        view = self._case_view(case)
        if view is None:
            return
        reached = _rounds_by_path(found.runs)
        missing = [p for p in PATHS if not reached[p]]
        entries = view.covering(missing) if missing else []
        if not entries:
            return

        @hypothesis.given(data=st.data())
        def covering(data: st.DataObject) -> None:
            self._draw_run(data, case)

        covering._hypothesis_internal_database_key = _COVERING_KEY  # type: ignore[attr-defined]
        settings = hypothesis.settings(
            self.plan.profile.hypothesis_settings(seed=None, database=replay_only(_COVERING_KEY, entries)),
            phases=[Phase.reuse],
            max_examples=max(1, len(entries)),
        )
        self._sink, self._choices = [], []
        try:
            settings(hypothesis.seed(0)(covering))()
        except unittest.SkipTest:
            pass
        finally:
            drawn, self._choices, self._sink = self._choices, None, None
        found.runs.extend(run for run, _ in drawn)
        found.covering.extend(drawn)
        now = _rounds_by_path(run for run, _ in drawn)
        store.covering[case.id] += len(drawn)
        store.covered[case.id] = [p for p in missing if now[p]]

    def _replay(self, case: EngineCase, found: _CaseSearch) -> None:
        """Replay the database first: each engine invariant's saved failures join the case's search.

        The one search of a case never fails (it feeds every invariant), so failures are saved by
        the per-invariant shrinking search; replaying that search's entries (Phase.reuse only)
        brings them back into this run, derandomized or not. An entry that no longer fails is
        dropped by Hypothesis (the bug was fixed).
        """
        if self.plan.database is None:
            return
        for item in self.checks("engine"):
            if item.engine is not case or item.invariant.driver != "engine-case":
                continue
            self._sink = []
            try:
                self._settings(self._failing_test(item), item=item, phases=[Phase.reuse])()
            except ViolationError:
                self.plan.database.replayed[item.id] += 1
            except unittest.SkipTest:
                pass  # nothing saved for this check: Hypothesis ran no example
            finally:
                found.runs.extend(self._sink)
                self._sink = None

    def _failing_test(self, item: CheckItem) -> Any:
        """The search that fails on one engine invariant only: its shrinking, and its database key.

        (Its source is its identity: Hypothesis derives the derandomized seed and the database key
        from it, so keep it as it is.)
        """
        case, inv = item.engine, item.invariant
        assert case is not None and inv.check is not None

        @hypothesis.given(data=st.data())
        def shrink(data: st.DataObject) -> None:
            outcome = inv.check(case, self._draw_run(data, case))  # type: ignore[misc]
            if outcome.violations:
                raise ViolationError(outcome.violations)

        return shrink

    def _run_engine_invariant(self, item: CheckItem, result: CheckResult) -> None:
        case, inv = item.engine, item.invariant
        assert case is not None and inv.check is not None
        search = self._search(case)
        if search.error is not None:
            raise search.error
        notes: Counter[str] = Counter()
        failed = False
        for run in search.runs:
            outcome = inv.check(case, run)
            result.examples += 1
            result.exercised += outcome.exercised
            result.paths.update(run.paths)
            if outcome.note and not outcome.exercised:
                notes[outcome.note] += 1
            if outcome.violations:
                failed = True
            result.excused += len(outcome.excused)
            result.excused_margins.extend(float(m) for m in outcome.excused if m is not None)
        result.notes = list(case.notes)
        if failed:
            self._shrink(item, result)
        if not result.exercised:
            reason = notes.most_common(1)[0][0] if notes else "no example reached this check"
            result.skip(reason)

    def _shrink(self, item: CheckItem, result: CheckResult) -> None:
        """Search again, failing on this invariant only, so Hypothesis shrinks to a minimal example."""
        case, inv = item.engine, item.invariant
        assert case is not None and inv.check is not None
        # raises the minimal failing example when the search finds one (and saves it in the database)
        # (a covering example from the database that fails is replayed first: shrunk from there,
        # its minimal example is saved in the check's namespace like any failure)
        covering = [raw for run, raw in self._searches[case.token].covering if inv.check(case, run).violations]
        self._settings(self._failing_test(item), item=item, replay=covering)()
        for ex in self._explicit(case):  # only an explicit example failed: it is small already
            run = self._execute(case, **ex)
            found = inv.check(case, run).violations
            if found:
                raise ViolationError(found)
        # the search found a failure that did not come back (a nondeterministic subject)
        raise ViolationError(
            [inv.violation("failed in the search, but not when searched again: the subject is nondeterministic")]
        )

    # ---- the state machines ------------------------------------------------------------

    def _run_machine(self, factory: Any, item: CheckItem, *, shrink: bool = True) -> None:
        """Run a state machine at the profile's settings, replaying the check's database namespace first."""
        from hypothesis.stateful import get_state_machine_test

        profile, database = self.plan.profile, self._view(item)
        settings = profile.hypothesis_settings(
            seed=self.plan.seed, max_examples=profile.stateful_examples, database=database
        )
        if not shrink:
            settings = hypothesis.settings(settings, phases=[p for p in settings.phases if p is not Phase.shrink])
        test = get_state_machine_test(factory, settings=settings, _flaky_state={"selecting_rule": False})
        seed = self.plan.seed
        if seed is None and database is not None:
            seed = derandomized_seed(test)  # the examples derandomize=True draws, with the database replayed first
        if seed is not None:
            # (not @seed: it would drop the database)
            test._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
        try:
            test()
        finally:
            from specproof.strategies import release_machine

            release_machine(factory)  # Hypothesis caches machine classes: they must not hold this run

    def _run_rollback_machine(self, item: CheckItem, result: CheckResult) -> None:
        from specproof.strategies import RollbackMachine, RollbackMachineFailure

        tsub = self.plan.suite.target
        assert tsub is not None and item.engine is not None
        rollbacks = tuple(c.rollback or "replay" for c in self.plan.suite.engines if c.kind == "builtin")
        inv = item.invariant
        machine = RollbackMachine.configure(
            target_factory=tsub.make, tolerance=tsub.atol, rollbacks=rollbacks, judges=self.cache.judges
        )

        class Counted(machine):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                result.examples += 1
                result.exercised += 1
                super().__init__()

        try:
            self._run_machine(Counted, item)
        except RollbackMachineFailure as exc:
            raise ViolationError(
                [
                    inv.violation(
                        f"RollbackMachine [{exc.prop}]: {exc.explanation.splitlines()[0]}",
                        round=exc.round,
                        example={**exc.example, "machine": str(exc)[:2000]},
                    )
                ]
            ) from exc
        except SpecproofError as exc:
            # the built-in decoder raised on the target (a contract breach it detected)
            raise ViolationError(
                [
                    inv.violation(
                        f"RollbackMachine: the decoder raised {type(exc).__name__}: {str(exc).splitlines()[0]}",
                        example={"machine": str(exc)[:2000]},
                    )
                ]
            ) from exc

    def _run_session_machine(self, item: CheckItem, result: CheckResult) -> None:
        from specproof.strategies import SessionFailure, SessionHistory, SessionMachine, replay_session, shrink_history

        case = item.engine
        assert case is not None and case.make_engine is not None
        # white-box after every request where the live target shows its state
        white_box = callable(getattr(case.live_target, "state_arrays", None)) and case.make_reference is not None
        # without a reference model the oracle is the engine's own greedy(), on the engine's caches
        shares_engine = case.make_reference is None
        horizon = self.plan.profile.max_new_tokens

        def greedy(prompt: Sequence[int], n: int, eos: int | None) -> tuple[list[int], Any]:
            # the same memoized continuations the engine-case search uses; when they come from the
            # engine, all it generated (the horizon), so the prefix-reuse bound credits what it holds
            return self._greedy(case, list(prompt), max(n, horizon) if shares_engine else n, eos)

        greedy.shares_engine = shares_engine  # type: ignore[attr-defined]
        judge = {
            "engine_factory": case.make_engine,
            "greedy": greedy,
            "vocab_size": case.vocab_size,
            "tie_tolerance": case.tie_tolerance,
            "reference_factory": case.make_reference if white_box else None,
            "atol": case.atol,
        }
        if self.plan.replay_session is not None:
            history = SessionHistory.load(self.plan.replay_session)
            result.examples = result.exercised = 1
            failures = replay_session(history, **judge)  # type: ignore[arg-type]
            if failures:
                raise ViolationError(_session_violations(item, failures))
            return
        self._replay_histories(item, judge, result)
        profile = self.plan.profile
        machine = SessionMachine.configure(
            **judge,  # type: ignore[arg-type]
            max_context=case.max_context,
            max_prompt=profile.max_prompt,
            max_new_tokens=min(profile.max_new_tokens, 16),
            stateful_step_count=profile.stateful_steps,
        )

        class Counted(machine):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                result.examples += 1
                result.exercised += 1
                super().__init__()

        try:
            # Hypothesis' shrinking of a request sequence replays whole sessions (7-9 s at quick);
            # shrink_history replays the found history on fresh engines instead (well under a second)
            self._run_machine(Counted, item, shrink=False)
        except SessionFailure as exc:
            history = SessionHistory.from_example(exc.example, vocab_size=case.vocab_size)
            history = attrs.evolve(history, engine=self.plan.specs.get("engine"))
            shorter = shrink_history(history, **judge)  # type: ignore[arg-type]
            failures = replay_session(shorter, **judge) or [exc]  # type: ignore[arg-type]
            self._save_history(shorter, case, item)
            raise ViolationError(_session_violations(item, failures)) from exc

    def _replay_histories(self, item: CheckItem, judge: dict[str, Any], result: CheckResult) -> None:
        """Replay the failing session histories the database holds for this check (before any search)."""
        import json as _json

        from specproof.strategies import SessionHistory, replay_session

        view, store = self._view(item), self.plan.database
        if view is None:
            return
        for raw in view.records(_HISTORIES):
            try:
                history = SessionHistory.from_json(_json.loads(raw), source=f"example database ({item.id})")
            except Exception as exc:
                store.warn(f"{item.id}: skipped a saved session history that does not load ({exc})")
                continue
            result.examples += 1
            result.exercised += 1
            failures = replay_session(history, **judge)
            if failures:
                store.replayed[item.id] += 1
                assert item.engine is not None
                self._save_history(history, item.engine, None)  # the file the reproduce line replays
                raise ViolationError(_session_violations(item, failures))
            view.delete(_HISTORIES, raw)  # no longer fails: the bug was fixed

    def _save_history(self, history: Any, case: EngineCase, item: CheckItem | None) -> None:
        """Save a failing session's request history, so the reproduce command replays exactly it
        (and, with a database, in the check's namespace there, so every later run replays it)."""
        import hashlib
        import json as _json
        from pathlib import Path

        text = _json.dumps(history.to_json(), sort_keys=True)
        folder = Path(self.plan.storage or Path.home() / ".cache" / "specproof") / "sessions"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"session-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
        history.save(path)
        view = self._view(item) if item is not None else None
        if view is not None:
            view.save(_HISTORIES, text.encode())
        self.session_files[case.id] = str(path)

    # ---- results -----------------------------------------------------------------------

    def reproduce_command(self, result: CheckResult) -> str:
        specs = self.plan.specs
        parts = ["specproof", "certify", str(specs.get("subject") or "all")]
        for key in ("drafter", "target", "engine"):
            if specs.get(key):
                parts += [f"--{key}", _quote(str(specs[key]))]
        parts += ["--profile", self.plan.profile.name, "--only", result.invariant]
        replay = self.plan.replay_session or self.session_files.get(result.case)
        if replay and registry.get(result.invariant).driver == "session-machine":
            parts += ["--replay-session", _quote(replay)]
        if self.plan.seed is not None:
            parts += ["--seed", str(self.plan.seed)]
        store = self.plan.database
        if store is not None and store.replayed.get(result.nodeid) and "--replay-session" not in parts:
            parts += ["--db", _quote(store.spec)]  # the failure came back from the database: replay it again
        if self.plan.tie_tolerance is not None:
            parts += ["--tie-tolerance", repr(self.plan.tie_tolerance)]
        if self.plan.atol is not None:
            parts += ["--atol", repr(self.plan.atol)]
        # a wire state-digest failure names the key its signs were drawn with: the command sets it, so
        # the pasted command compares the same projections (the engine never sees the key)
        keys = {m[1] for v in result.violations for m in _DIGEST_KEY.finditer(str(v.explanation))}
        prefix = [f"{_DIGEST_KEY_ENV}={min(keys)}"] if keys else []
        # a plug-in found in the working directory: the command runs from there
        found = [d for key in ("drafter", "target", "engine") if (d := plugin_directory(specs.get(key)))]
        prefix = ["cd", _quote(found[0]), "&&", *prefix] if found else prefix
        return " ".join(prefix + parts)

    def path_coverage(self) -> dict[str, dict[str, int]]:
        """Rounds by path per engine case (from the one search of each case)."""
        out: dict[str, dict[str, int]] = {}
        for case in self.plan.suite.engines:
            search = self._searches.get(case.token)
            if search is None:
                continue
            total = _rounds_by_path(search.runs)
            completed = sum(run.completed for run in search.runs)
            out[case.id] = {"generations": len(search.runs), "completed": completed, **{p: total[p] for p in PATHS}}
        return out

    def runs_of(self, case: EngineCase) -> list[EngineRun]:
        """The runs of an engine case's one search, in the order drawn (empty: it never searched)."""
        search = self._searches.get(case.token)
        return list(search.runs) if search is not None else []

    def unreached_paths(self) -> dict[str, list[str]]:
        """Per engine case judged on its own drafts: the rollback paths its rounds never took.

        The suite drives an engine that takes its drafts down every path; one that drafts for
        itself (no settable drafter, or no ``suite_drafts`` capability) reaches what its drafter
        happens to reach. A path in ``OWN_DRAFT_PATHS`` it never took makes the verdict
        INCONCLUSIVE (the checks of that path ran on nothing), not a pass.
        """
        out: dict[str, list[str]] = {}
        for case in self.plan.suite.engines:
            search = self._searches.get(case.token)
            if search is None or case.kind != "plugin" or case.takes_drafter:
                continue
            if not any(run.record is not None and run.record.generation.steps for run in search.runs):
                continue  # black-box: no rounds to classify (its certificate says which checks were skipped)
            total = _rounds_by_path(search.runs)
            missing = [p for p in OWN_DRAFT_PATHS if not total[p]]
            if missing:
                out[case.id] = missing
        return out


def _rounds_by_path(runs: Iterable[EngineRun]) -> Counter[str]:
    """Rounds by rollback path over these runs (the path-coverage table's counts)."""
    total: Counter[str] = Counter()
    for run in runs:
        total.update(run.paths)
    return total


_HISTORIES = b"specproof-session-histories"  # the record name of saved histories in a check's namespace


def _session_violations(item: CheckItem, failures: Sequence[Any]) -> list[Violation]:
    """The session machine's failures (``SessionFailure``) as violations of the check's invariant."""
    return [
        item.invariant.violation(f.explanation, expected=f.expected, actual=f.actual, example=f.example)
        for f in failures
    ]


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
