"""The driver protocol: what a kind of search receives, what it fills in, how it is selected.

A driver runs the checks of the invariants whose registry entry names it (``driver=``):

- ``checks(invariant, suite)`` (a class method) yields the ``CheckItem`` s of one invariant on
  the subjects of a suite (the default: one per engine case);
- ``Driver(context)`` is made once per certification, on first use, with the
  ``DriverContext`` it shares with the other drivers (the plan, the run cache, the example
  database's replay, the engine-case searches, the saved session histories);
- ``run(item, result)`` runs one check and fills its ``CheckResult``: ``examples`` tried,
  ``exercised`` (what reached the check; none makes it a skip), ``paths``, ``notes``. It
  reports violations by raising ``ViolationError`` (the certification records them, builds
  the reproduce command and applies ``--expect-fail``), a check that does not apply with
  ``result.skip(reason)``; any other exception is the check's ``error``;
- ``reproduce_args(result)`` adds options of its own to the failing check's reproduce
  command (the session machine: ``--replay-session FILE``); the rest is built in one place.

docs/contract.md, "Drivers".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import attrs

from specproof.conformance import _registry as registry
from specproof.conformance._engine_runs import CaseSearch, RunCache
from specproof.conformance._subjects import EngineCase, Suite

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._plan import Plan
    from specproof.conformance._replay import Replay
    from specproof.conformance._results import CheckResult

__all__ = ["CheckItem", "Driver", "DriverContext"]


@attrs.frozen
class CheckItem:
    """One check to run: a registry entry on one subject case (pytest id: ``case-invariant``)."""

    invariant: registry.Invariant
    case_id: str
    engine: EngineCase | None = attrs.field(default=None, eq=False)

    @property
    def id(self) -> str:
        return f"{self.case_id}-{self.invariant.id}" if self.invariant.subject == "engine" else self.invariant.id


@attrs.define
class DriverContext:
    """What every driver of one certification shares (its caches die with the certification)."""

    plan: Plan
    cache: RunCache
    replay: Replay
    checks: Callable[[registry.Subject], list[CheckItem]]  # the check generator, on this plan
    searches: dict[int, CaseSearch] = attrs.Factory(dict)  # engine case token -> its one search
    session_files: dict[str, str] = attrs.Factory(dict)  # case id -> the saved history of its failing session


class Driver:
    """The base of every driver: one kind of search behind ``run`` (see the module docstring)."""

    name: ClassVar[str] = ""

    def __init__(self, context: DriverContext) -> None:
        self.context = context

    @property
    def plan(self) -> Plan:
        return self.context.plan

    @classmethod
    def checks(cls, invariant: registry.Invariant, suite: Suite) -> Iterator[CheckItem]:
        """The checks of one invariant on a suite: by default one per engine case."""
        for case in suite.engines:
            yield CheckItem(invariant, case.id, case)

    def run(self, item: CheckItem, result: CheckResult) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def reproduce_args(self, result: CheckResult) -> Sequence[str]:
        """Options of this driver's own for a failing check's reproduce command (none by default)."""
        return ()
