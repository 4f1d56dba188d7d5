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
  the reproduce command and applies ``--expect-fail``), a check that does not apply by raising
  ``NotApplicable(reason)`` (``require(invariant, capabilities)`` raises it for a missing
  capability) or with ``result.skip(reason)``; any other exception is the check's ``error``;
- ``options`` (a class attribute) names the plan options an opt-in driver's checks run only with
  (``_options.OPTIONS`` dests: ``batches``, ``trees``, ``sampling``...): the certification runs a
  check through ``run_check``, which skips it, naming the option to give, before ``run`` when one
  is not given (the reason is the option's own, ``Option.not_given``);
- ``reproduce_args(result)`` adds options of its own to the failing check's reproduce
  command (the session machine: ``--replay-session FILE``); the rest is built in one place.

docs/contract.md, "Drivers".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import attrs

from specproof.conformance import _options
from specproof.conformance import _registry as registry
from specproof.conformance._engine_runs import CaseSearch, RunCache
from specproof.conformance._subjects import EngineCase, Suite

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._plan import Plan
    from specproof.conformance._records import Capabilities
    from specproof.conformance._replay import Replay
    from specproof.conformance._results import CheckResult

__all__ = ["CheckItem", "Driver", "DriverContext", "NotApplicable", "require"]


class NotApplicable(Exception):
    """A check that does not apply to this subject (no subject of its kind, a missing capability): a skip
    with this reason, never a pass."""


def require(invariant: registry.Invariant, capabilities: Capabilities) -> None:
    """Raise ``NotApplicable`` saying what is missing when ``capabilities`` lack what ``invariant`` needs."""
    lacks = invariant.applies(capabilities)
    if lacks is not None:
        raise NotApplicable(lacks)


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
    options: ClassVar[tuple[str, ...]] = ()  # the plan options (OPTIONS dests) its checks run only with

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

    def not_asked(self) -> str | None:
        """Why this plan runs none of this driver's checks (the first of ``options`` not given), or None."""
        for dest in self.options:
            value = getattr(self.plan, dest)
            if value is None or value is False:
                return _options.get(dest).not_given()
        return None

    def run_check(self, item: CheckItem, result: CheckResult) -> None:
        """Run one check as the certification does: a skip when an option of ``options`` was not given or
        ``run`` raises ``NotApplicable``; what ``run`` fills in or raises otherwise."""
        reason = self.not_asked()
        if reason is not None:
            result.skip(reason)
            return
        try:
            self.run(item, result)
        except NotApplicable as exc:
            result.skip(str(exc))

    def run(self, item: CheckItem, result: CheckResult) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def reproduce_args(self, result: CheckResult) -> Sequence[str]:
        """Options of this driver's own for a failing check's reproduce command (none by default)."""
        return ()
