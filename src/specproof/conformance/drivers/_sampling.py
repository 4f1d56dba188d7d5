"""The ``sampling`` driver: the sampled search of each engine case, and the drafter's declared ``q``.

Its invariants run only when the plan samples (``--sampling``); without it each is a skip that
says so. An engine case is searched once (``_sampled_runs.run_sampled_search``) and every engine
invariant of this driver judges that search; the drafter invariant draws its own proposals.
docs/contract.md, "Sampling".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from specproof.conformance import _registry as registry
from specproof.conformance._engine_runs import case_greedy
from specproof.conformance._sampled_runs import SampledSearch, run_sampled_search
from specproof.conformance._sequential import FALSE_FAIL_BOUND
from specproof.conformance._subjects import Suite
from specproof.conformance.drivers._protocol import CheckItem, Driver, NotApplicable
from specproof.contract import ViolationError

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._results import CheckResult

__all__ = ["SamplingDriver"]


class SamplingDriver(Driver):
    """One sampled search per engine case, judged by each engine invariant of this driver."""

    name = "sampling"
    options = ("sampling",)

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._searches: dict[int, SampledSearch] = {}

    @classmethod
    def checks(cls, invariant: registry.Invariant, suite: Suite) -> Iterator[CheckItem]:
        if invariant.subject == "drafter":
            if suite.certify_drafter:
                yield CheckItem(invariant, "drafter")
            return
        yield from super().checks(invariant, suite)

    def search(self, item: CheckItem) -> SampledSearch:
        case = item.engine
        assert case is not None and self.plan.sampling is not None
        found = self._searches.get(case.token)
        if found is None:
            suite = self.plan.suite
            found = self._searches[case.token] = run_sampled_search(
                case,
                target=suite.target,
                drafter_subject=suite.drafter,
                params=self.plan.sampling,
                profile=self.plan.profile,
                seed=self.plan.seed or 0,
                alpha=FALSE_FAIL_BOUND,
            )
        return found

    def run(self, item: CheckItem, result: CheckResult) -> None:
        inv = item.invariant
        assert inv.check is not None
        if inv.subject == "drafter":
            subject = self.plan.suite.drafter
            outcome = inv.check(self, subject)
        else:
            search = self.search(item)
            if search.why_not is not None:
                raise NotApplicable(search.why_not)
            outcome = inv.check(self, _Judged(item.engine, search, self))
        result.examples += max(outcome.exercised, 1)
        result.statistics = outcome.statistics
        result.exercised += outcome.exercised
        if outcome.note:
            result.notes.extend(outcome.note.split("\n"))
        if outcome.violations:
            raise ViolationError(outcome.violations)
        if not outcome.exercised:
            result.skip(outcome.note.split("\n")[0] if outcome.note else "nothing reached this check")


class _Judged:
    """What an engine sampling invariant judges: the case, its search, and plain greedy for the case."""

    def __init__(self, case: Any, search: SampledSearch, driver: SamplingDriver) -> None:
        self.case = case
        self.search = search
        self.plan = driver.plan
        self._cache = driver.context.cache

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[float] | None]:
        return case_greedy(self.case, self.plan.suite.target, prompt, n, None, horizon=n, cache=self._cache)
