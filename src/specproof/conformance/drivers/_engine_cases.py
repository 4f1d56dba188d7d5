"""The ``engine-case`` driver: one search per engine case feeds every engine invariant.

Each engine case is searched once (the database's saved failures first, then the
hand-picked examples, then the profile's examples); every engine invariant judges every
run of that search. A failure is searched again on its invariant alone, so Hypothesis
shrinks it to a minimal example (and saves it in the check's namespace).
"""

from __future__ import annotations

import time
import unittest
from collections import Counter
from typing import TYPE_CHECKING, Any

import hypothesis
from hypothesis import Phase
from hypothesis import strategies as st
from hypothesis.database import choices_to_bytes

from specproof.conformance._engine_runs import CaseSearch, EngineRun
from specproof.conformance._subjects import EngineCase
from specproof.conformance.drivers._engine_draws import EngineExamples
from specproof.conformance.drivers._protocol import CheckItem, Driver, DriverContext
from specproof.contract import ViolationError

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._results import CheckResult

__all__ = ["EngineCaseDriver"]


class EngineCaseDriver(Driver):
    """The engine invariants judged over the one search of their engine case."""

    name = "engine-case"

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.examples = EngineExamples(context.plan, context.cache)
        self._sink: list[EngineRun] | None = None  # the runs a database replay draws
        self._choices: list[tuple[EngineRun, bytes]] | None = None  # runs drawn, with their choice sequences
        # engine case token -> its search's draws and the database's (replayed from the invariants'
        # namespaces), with their choices: a failing one is replayed first by the shrinking search
        self._drawn: dict[int, list[tuple[EngineRun, bytes]]] = {}
        self._given: dict[int, list[tuple[EngineRun, bytes]]] = {}

    def run(self, item: CheckItem, result: CheckResult) -> None:
        case, inv = item.engine, item.invariant
        assert case is not None and inv.check is not None
        search = self._search(case)
        if search.error is not None:
            raise search.error
        notes: Counter[str] = Counter()
        failed: list[EngineRun] = []
        for run in search.runs:
            outcome = inv.check(case, run)
            result.examples += 1
            result.exercised += outcome.exercised
            result.paths.update(run.paths)
            if outcome.note and not outcome.exercised:
                notes[outcome.note] += 1
            if outcome.violations:
                failed.append(run)
            result.excused += len(outcome.excused)
            result.excused_margins.extend(float(m) for m in outcome.excused if m is not None)
        result.notes = list(case.notes)
        if failed:
            self._shrink(item, result, failed)
        if not result.exercised:
            reason = notes.most_common(1)[0][0] if notes else "no example reached this check"
            result.skip(reason)

    def _shrink(self, item: CheckItem, result: CheckResult, failed: list[EngineRun]) -> None:
        """Search again, failing on this invariant only, so Hypothesis shrinks to a minimal example."""
        case, inv = item.engine, item.invariant
        assert case is not None and inv.check is not None
        # raises the minimal failing example when the search finds one (and saves it in the database)
        # The examples that failed are replayed first, so it is shrunk from the very example: one the
        # database gave (a covering example, another invariant's saved failure: the seed alone does
        # not draw it; its minimal example is saved in this check's namespace like any failure), or
        # one the search drew itself
        failing = {id(run) for run in failed}
        given = [*self.context.searches[case.token].covering, *self._given.get(case.token, ())]
        replay = [raw for run, raw in given if id(run) in failing]
        again = [raw for run, raw in self._drawn.get(case.token, ()) if id(run) in failing]
        self.context.replay.settings(self._failing_test(item), item=item, replay=replay, again=again)()
        for ex in self.examples.explicit(case):  # only an explicit example failed: it is small already
            run = self.examples.execute(case, **ex)
            found = inv.check(case, run).violations
            if found:
                raise ViolationError(found)
        # the very example that failed in the search passed when run again (a nondeterministic subject)
        raise ViolationError(
            [
                inv.violation(
                    "failed in the search, but the same example passed when run again: the subject is nondeterministic"
                )
            ]
        )

    def _draw_run(self, data: st.DataObject, case: EngineCase) -> EngineRun:
        """Draw one example for an engine case and run it (cached: the shrink searches reuse runs)."""
        run = self.examples.draw(data, case)
        if self._sink is not None:
            self._sink.append(run)
        if self._choices is not None:
            # every draw of the example is made: its choices replay it (a covering example)
            self._choices.append((run, choices_to_bytes(data.conjecture_data.choices)))
        return run

    def _search(self, case: EngineCase) -> CaseSearch:
        found = self.context.searches.get(case.token)
        if found is not None:
            return found
        found = self.context.searches[case.token] = CaseSearch()
        replay = self.context.replay
        start = time.perf_counter()
        try:
            self._replay(case, found)
            for ex in self.examples.explicit(case):
                found.runs.append(self.examples.execute(case, **ex))

            @hypothesis.given(data=st.data())
            def search(data: st.DataObject) -> None:
                found.runs.append(self._draw_run(data, case))

            saving = self.plan.seed is not None and self.plan.database is not None
            self._choices = []
            try:
                replay.settings(search)()
            finally:
                drawn, self._choices = self._choices or [], None
                self._drawn[case.token] = drawn
            if saving:
                replay.keep_covering(case, drawn)
            else:
                replay.replay_covering(case, found, lambda data: self._draw_run(data, case))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            found.error = exc
        found.seconds = time.perf_counter() - start
        return found

    def _replay(self, case: EngineCase, found: CaseSearch) -> None:
        """Replay the database first: each engine invariant's saved failures join the case's search.

        The one search of a case never fails (it feeds every invariant), so failures are saved by
        the per-invariant shrinking search; replaying that search's entries (Phase.reuse only)
        brings them back into this run, derandomized or not. An entry that no longer fails is
        dropped by Hypothesis (the bug was fixed).
        """
        if self.plan.database is None:
            return
        for item in self.context.checks("engine"):
            if item.engine is not case or item.invariant.driver != "engine-case":
                continue
            self._sink, self._choices = [], []
            try:
                self.context.replay.settings(self._failing_test(item), item=item, phases=[Phase.reuse])()
            except ViolationError:
                self.plan.database.replayed[item.id] += 1
            except unittest.SkipTest:
                pass  # nothing saved for this check: Hypothesis ran no example
            finally:
                found.runs.extend(self._sink)
                self._given.setdefault(case.token, []).extend(self._choices)
                self._sink = self._choices = None

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
