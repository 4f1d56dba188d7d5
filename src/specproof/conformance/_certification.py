"""A certification: the checks a plan selects, run by their drivers, and their results.

- the checks come from the generator (``_checks``: registry x subjects x ``--only``);
- each check runs on the driver its invariant names (``drivers``: examples, engine-case,
  rollback machine, session machine), made once per certification with a shared
  ``DriverContext`` (the plan, the run cache, the database replay, the engine-case searches);
- results are ``CheckResult`` records: the verdict is settled, the reproduce command built
  (``_reproduce``) and ``--expect-fail`` applied here, the same way for every driver;
- path coverage is read from the engine-case searches. The pytest plugin and ``certify()``
  only glue this into pytest, and ``reports`` renders it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import attrs

from specproof.conformance import _registry as registry
from specproof.conformance._checks import generate_checks
from specproof.conformance._engine_runs import PATHS, EngineRun, RunCache, rounds_by_path
from specproof.conformance._plan import Plan
from specproof.conformance._replay import Replay
from specproof.conformance._reproduce import reproduce_command
from specproof.conformance._results import CheckResult
from specproof.conformance._speculation import declares_not_speculative
from specproof.conformance._subjects import EngineCase
from specproof.conformance.drivers import CheckItem, Driver, DriverContext, driver_class
from specproof.contract import ViolationError
from specproof.strategies import no_local_constants

__all__ = ["OWN_DRAFT_PATHS", "Certification"]

# The rollback paths an engine judged on its own drafts (no suite_drafts) must reach for a PASS:
# the suite cannot drive it there, so a path it never took is a path nobody checked
# (docs/contract.md, "Engines").
OWN_DRAFT_PATHS: tuple[str, ...] = ("all_accepted", "partial", "rejected_at_0", "eos_in_accepted")


class Certification:
    """The checks a plan selects and the drivers that run them; results by check id."""

    def __init__(
        self,
        plan: Plan,
        *,
        on_result: Callable[[CheckResult], None] | None = None,
        invariants: Iterable[registry.Invariant] | None = None,
    ) -> None:
        """``on_result`` is called with each check's result as it finishes (progress for the CLI);
        ``invariants``: the registry the checks come from (the project's own by default)."""
        self.plan = plan
        self.on_result = on_result
        self.invariants = None if invariants is None else tuple(invariants)
        # Inside a pytest run a check executes under pytest's output capture, where a progress line
        # would be swallowed: the plugin sets this and hands the results on after each test.
        self.defer_results = False
        self._finished: list[CheckResult] = []
        self.cache = RunCache()  # runs, greedy continuations and judges: this certification's only
        self.results: dict[str, CheckResult] = {}
        self.started = time.perf_counter()
        self.interrupted = False
        self.context = DriverContext(plan=plan, cache=self.cache, replay=Replay(plan), checks=self.checks)
        self._drivers: dict[str, Driver] = {}

    @property
    def session_files(self) -> dict[str, str]:
        """Case id -> the saved history of its failing session."""
        return self.context.session_files

    # ---- what runs ---------------------------------------------------------------------

    def checks(self, subject: registry.Subject) -> list[CheckItem]:
        """The checks of one area, derived from the registry, the suite and ``--only``."""
        return list(generate_checks(self.plan, subject, invariants=self.invariants))

    def all_checks(self) -> list[CheckItem]:
        return [*self.checks("drafter"), *self.checks("target"), *self.checks("engine")]

    def driver(self, name: str) -> Driver:
        """The driver of this name, made on first use with this certification's context."""
        found = self._drivers.get(name)
        if found is None:
            found = self._drivers[name] = driver_class(name)(self.context)
        return found

    # ---- running -----------------------------------------------------------------------

    def run(self, item: CheckItem) -> CheckResult:
        """Run one check to its verdict (never raises for a verdict; KeyboardInterrupt propagates)."""
        inv = item.invariant
        result = CheckResult(nodeid=item.id, invariant=inv.id, case=item.case_id)
        self.results[item.id] = result
        driver = self.driver(inv.driver)
        start = time.perf_counter()
        try:
            with no_local_constants():  # the same examples in every process, whatever local code it imported
                driver.run_check(item, result)
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
            self._name_known_cause(item, result)
        if result.status in ("fail", "error"):
            result.reproduce = reproduce_command(self.plan, result, driver_args=driver.reproduce_args(result))
        reason = self.plan.expected_failures.get(inv.id)
        if reason is not None:
            result.expect_failure(reason)
        self._hand_on(result)
        return result

    def _name_known_cause(self, item: CheckItem, result: CheckResult) -> None:
        """A failure an engine knows the upstream cause of (its ``known_cause(invariant)``: the real-engine
        adapters' table, docs/real-engines.md) says it, with the workaround, in every violation and the detail."""
        case = next((c for c in self.plan.suite.engines if c.id == item.case_id), None)
        explain = getattr(case.engine, "known_cause", None) if case is not None else None
        known = explain(item.invariant.id) if callable(explain) else None
        if not isinstance(known, str) or not known:
            return
        result.violations = [attrs.evolve(v, explanation=f"{v.explanation} — {known}") for v in result.violations]
        result.detail = f"{result.detail} — {known}"

    def _hand_on(self, result: CheckResult) -> None:
        if self.on_result is not None:
            if self.defer_results:
                self._finished.append(result)
            else:
                self.on_result(result)

    def hand_on_results(self) -> None:
        """Give ``on_result`` the results deferred while a check ran under pytest's capture."""
        finished, self._finished = self._finished, []
        if self.on_result is not None:
            for result in finished:
                self.on_result(result)

    def reproduce_command(self, result: CheckResult) -> str:
        """The command that runs this (failing) check again (``_reproduce``)."""
        known = registry.REGISTRY if self.invariants is None else self.invariants
        inv = next((i for i in known if i.id == result.invariant), None)
        extra = self.driver(inv.driver).reproduce_args(result) if inv is not None else ()
        return reproduce_command(self.plan, result, driver_args=extra)

    # ---- coverage ----------------------------------------------------------------------

    def path_coverage(self) -> dict[str, dict[str, int]]:
        """Rounds by path per engine case (from the one search of each case)."""
        out: dict[str, dict[str, int]] = {}
        for case in self.plan.suite.engines:
            search = self.context.searches.get(case.token)
            if search is None:
                continue
            total = rounds_by_path(search.runs)
            completed = sum(run.completed for run in search.runs)
            out[case.id] = {"generations": len(search.runs), "completed": completed, **{p: total[p] for p in PATHS}}
        return out

    def runs_of(self, case: EngineCase) -> list[EngineRun]:
        """The runs of an engine case's one search, in the order drawn (empty: it never searched)."""
        search = self.context.searches.get(case.token)
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
            search = self.context.searches.get(case.token)
            if search is None or case.kind != "plugin" or case.takes_drafter:
                continue
            if not any(run.record is not None and run.record.generation.steps for run in search.runs):
                continue  # black-box: no rounds to classify (its certificate says which checks were skipped)
            total = rounds_by_path(search.runs)
            missing = [p for p in OWN_DRAFT_PATHS if not total[p]]
            if missing:
                out[case.id] = missing
        return out

    # ---- speculation counts ------------------------------------------------------------

    def speculation_counts(self) -> dict[str, dict[str, object]]:
        """Per engine case that does not declare ``speculative = False``: what its generations' ``stats`` say
        it drafted and accepted over its one search (a black-box engine shows its speculation only there).

        ``with_stats`` counts the completed generations that returned ``stats`` at all; ``by_position`` is the
        acceptance per draft position where the engine reports ``position_attempts`` (None where none does).
        """
        out: dict[str, dict[str, object]] = {}
        for case in self.plan.suite.engines:
            if declares_not_speculative(case.engine):
                continue
            records = [run.record for run in self.runs_of(case) if run.record is not None]
            if not records:
                continue
            stats = [r.generation.stats for r in records if r.generation.stats is not None]
            attempts: list[int] = []
            accepts: list[int] = []
            for st in stats:
                for counts, row in ((attempts, st.position_attempts), (accepts, st.position_accepts)):
                    counts.extend([0] * (len(row) - len(counts)))
                    for i, n in enumerate(row):
                        counts[i] += int(n)
            drafted = sum(st.drafted for st in stats)
            accepted = sum(st.accepted for st in stats)
            out[case.id] = {
                "generations": len(records),
                "with_stats": len(stats),
                "drafted": drafted,
                "accepted": accepted,
                "acceptance": round(accepted / drafted, 4) if drafted else None,
                "by_position": (
                    [
                        {"attempts": n, "accepted": a, "rate": round(a / n, 4) if n else None}
                        for n, a in zip(attempts, [*accepts, *[0] * (len(attempts) - len(accepts))])
                    ]
                    if any(attempts)
                    else None
                ),
            }
        return out
