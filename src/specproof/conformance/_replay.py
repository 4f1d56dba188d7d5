"""Replay: what the example database gives back, and the Hypothesis settings that replay it first.

One ``Replay`` per certification holds, for every driver:

- the database **namespace** of a check (subjects, invariant, tolerances, profile) and the
  Hypothesis **settings** of a search or state machine run in it: the profile's, with the
  check's saved failures replayed first (``Phase.reuse``) and derandomized examples after;
- the **covering examples**: per engine case and rollback path, the smallest example a seeded
  run reached it with (saved by seeded runs, replayed by derandomized ones for the paths their
  own search missed);
- the **session histories**: a failing session's request history, saved in the check's
  namespace (every later run replays it first; one found only in the local directory is
  republished to a shared database) and to a file under Hypothesis' directory (the reproduce
  command replays it).
"""

from __future__ import annotations

import hashlib
import json
import unittest
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import hypothesis
from hypothesis import Phase
from hypothesis import strategies as st
from hypothesis.database import MultiplexedDatabase, choices_to_bytes
from hypothesis.internal.reflection import function_digest

from specproof.conformance._database import check_key, derandomized_seed, replay_only, shortlex
from specproof.conformance._engine_runs import PATHS, CaseSearch, EngineRun, rounds_by_path

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._plan import Plan
    from specproof.conformance._subjects import EngineCase
    from specproof.conformance.drivers._protocol import CheckItem

__all__ = ["Replay"]

_COVERING_KEY = b"covering"  # the Hypothesis key the covering replay asks its read-only database for
_HISTORIES = b"specproof-session-histories"  # the record name of saved histories in a check's namespace


@attrs.define
class Replay:
    """The example database of one plan, as the drivers search and replay with it."""

    plan: Plan

    # ---- namespaces and settings ---------------------------------------------------------

    def namespace(self, invariant: str, case_id: str, case: EngineCase | None) -> str | None:
        """The example-database namespace of a check: subjects, invariant, tolerances and profile."""
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

    def view(self, item: CheckItem | None) -> Any:
        """The check's namespace of the database (None: no database, or no check)."""
        store = self.plan.database
        key = None if item is None else self.namespace(item.invariant.id, item.case_id, item.engine)
        return None if store is None or key is None else store.view(key, check=item.id)  # type: ignore[union-attr]

    def settings(
        self,
        fn: Any,
        *,
        max_examples: int | None = None,
        item: CheckItem | None = None,
        phases: Any = None,
        replay: Sequence[bytes] = (),
        again: Sequence[bytes] = (),
    ) -> Any:
        """``fn`` (a ``@given`` test) under the profile's settings; with a database, the check's own
        namespace and Phase.reuse first.

        Choice sequences replayed first too (``Phase.reuse``, not saved from here): ``replay``, saved
        examples the database gave back elsewhere (covering examples, another check's failures),
        counted as given back to the check (its reproduce line names the database); ``again``, this
        run's own failing examples, so the search shrinks from the very example that failed (with or
        without a database)."""
        database = self.view(item)
        entries = [*replay, *again]
        if entries:
            key = function_digest(fn.hypothesis.inner_test)  # the key Hypothesis reads the test's entries at
            extra = replay_only(key, entries)
            database = extra if database is None else MultiplexedDatabase(database, extra)
            if replay and item is not None and self.plan.database is not None:
                self.plan.database.given_back[item.id] += len(replay)
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

    def run_machine(self, factory: Any, item: CheckItem, *, shrink: bool = True) -> None:
        """Run a state machine at the profile's settings, replaying the check's database namespace first."""
        from hypothesis.stateful import get_state_machine_test

        from specproof.strategies import release_machine

        profile, database = self.plan.profile, self.view(item)
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
            release_machine(factory)  # Hypothesis caches machine classes: they must not hold this run

    # ---- covering examples: rare paths a seeded run reached, replayed by derandomized ones ----

    def _case_view(self, case: EngineCase) -> Any:
        key = self.namespace("(engine case search)", case.id, case)
        return None if key is None else self.plan.database.view(key, check=f"{case.id} search")

    def keep_covering(self, case: EngineCase, drawn: list[tuple[EngineRun, bytes]]) -> None:
        """A seeded search keeps, per rollback path, the smallest example of its own that reached it.

        (Only seeded runs save: a derandomized run draws the same examples every time, so what
        it reaches it reaches anyway, and its database stays as the campaigns left it.)
        """
        view = self._case_view(case)
        for path in PATHS:
            reached = [raw for run, raw in drawn if run.paths[path]]
            if reached and view.keep_covering(path, min(reached, key=shortlex)):
                self.plan.database.covering_saved[case.id] += 1

    def replay_covering(self, case: EngineCase, found: CaseSearch, draw: Callable[[st.DataObject], EngineRun]) -> None:
        """After a derandomized search: replay the covering examples of the paths it did not reach.

        A path the search reached costs nothing; each unreached one costs its one saved example.
        Replayed with Phase.reuse only, through a read-only database: a covering example that
        passes is kept (Hypothesis would delete it), one that fails feeds the invariants as any
        other run does, and is shrunk from its saved choices (the engine-case driver's shrink).
        """
        store = self.plan.database
        if found.error is not None or store is None or not store.replay_covering:  # --db-replay failures
            return
        view = self._case_view(case)
        if view is None:
            return
        reached = rounds_by_path(found.runs)
        missing = [p for p in PATHS if not reached[p]]
        entries = view.covering(missing) if missing else []
        if not entries:
            return
        drawn: list[tuple[EngineRun, bytes]] = []

        @hypothesis.given(data=st.data())
        def covering(data: st.DataObject) -> None:
            run = draw(data)
            # every draw of the example is made: its choices are the covering example
            drawn.append((run, choices_to_bytes(data.conjecture_data.choices)))

        covering._hypothesis_internal_database_key = _COVERING_KEY  # type: ignore[attr-defined]
        settings = hypothesis.settings(
            self.plan.profile.hypothesis_settings(seed=None, database=replay_only(_COVERING_KEY, entries)),
            phases=[Phase.reuse],
            max_examples=max(1, len(entries)),
        )
        try:
            settings(hypothesis.seed(0)(covering))()
        except unittest.SkipTest:
            pass
        found.runs.extend(run for run, _ in drawn)
        found.covering.extend(drawn)
        now = rounds_by_path(run for run, _ in drawn)
        store.covering[case.id] += len(drawn)
        store.covered[case.id] = [p for p in missing if now[p]]

    # ---- session histories ------------------------------------------------------------------

    def histories(self, item: CheckItem) -> Iterator[tuple[Any, bytes]]:
        """The failing session histories saved in the check's namespace (ones that do not load are skipped);
        with a shared database, those found only in the local directory are saved to it (``records``)."""
        from specproof.strategies import SessionHistory

        view, store = self.view(item), self.plan.database
        if view is None:
            return
        for raw in view.records(_HISTORIES):
            try:
                history = SessionHistory.from_json(json.loads(raw), source=f"example database ({item.id})")
            except Exception as exc:
                store.warn(f"{item.id}: skipped a saved session history that does not load ({exc})")
                continue
            yield history, raw

    def forget_history(self, item: CheckItem, raw: bytes) -> None:
        """A saved history no longer fails (the bug was fixed): drop it."""
        self.view(item).delete(_HISTORIES, raw)

    def save_history(self, history: Any, item: CheckItem | None) -> str:
        """Keep a failing session's request history: in the check's namespace of the example database
        (every later run, and every machine sharing the database, replays it first; the save is read
        back like any other, ``_database._Directory``), and as a file the reproduce command replays
        (``--replay-session FILE``), in ``sessions/`` of Hypothesis' directory (``--hypothesis-dir``,
        else $SPECPROOF_HYPOTHESIS_DIR, else the user cache): never beside it. Returns the file's path.

        ``item``: the check whose namespace keeps it (None: the file only, for a history replayed
        from the database, which holds it already)."""
        from specproof.conformance._database import hypothesis_home

        text = json.dumps(history.to_json(), sort_keys=True)
        folder = Path(self.plan.storage or hypothesis_home()) / "sessions"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"session-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
        history.save(path)
        view = self.view(item) if item is not None else None
        if view is not None:
            view.save(_HISTORIES, text.encode())
        return str(path)
