"""The ``tree-sampling`` driver: the sampled tree search of each engine case that verifies trees
(docs/contract.md, "Sampled trees").

It runs with ``--trees`` and ``--sampling`` both given (else a skip saying which is missing), on the cases
the ``tree-cases`` driver takes (the built-in tree decoder on the reference hybrid; a plug-in engine's
``tree_decoder``) whose tree decoder's ``generate`` takes ``sampling=``. Two searches per engine case, one per
configuration: the suite's deterministic trees (``SUITE_TREES``) and a real drafter's sampled trees
(``top_k_tree_source``: a ``TopKTreeDrafter`` declaring each node's ``q``), each ``GENERATIONS_PER_PROFILE``
times the profile's sampled generation budget at the profile's generation length, each given half the
check's false-fail bound. A configuration that could not reach the profile's sensitivity makes the check a
skip saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specproof.conformance._sequential import FALSE_FAIL_BOUND
from specproof.conformance._tree_drafter_runs import top_k_tree_source
from specproof.conformance._tree_sampled_runs import MAX_DEPTH, SUITE_TREES, run_tree_sampled_search
from specproof.conformance.drivers._protocol import CheckItem, NotApplicable
from specproof.conformance.drivers._trees import TreeDriver
from specproof.contract import ViolationError

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Outcome
    from specproof.conformance._results import CheckResult

__all__ = ["GENERATIONS_PER_PROFILE", "TreeSamplingDriver"]

GENERATIONS_PER_PROFILE = 4
"""A tree round scores 1-2 events per position it reaches: four times the chain search's generations gives the
event tests the power to see a sibling rule off by a few percent of mass at quick (docs/contract.md)."""
LONGEST_PROMPT = 30


class TreeSamplingDriver(TreeDriver):
    """Seeded sampled generations of each tree engine case, scored against the oracle's ``p``."""

    name = "tree-sampling"
    options = ("trees", "sampling")

    def run(self, item: CheckItem, result: CheckResult) -> None:
        inv, case = item.invariant, item.engine
        assert case is not None and inv.check is not None
        plan = self.plan
        assert plan.sampling is not None  # (``options``)
        subject = self._subject(case)
        profile = plan.profile
        room = (case.capacity or case.max_context or 64) - profile.max_new_tokens - MAX_DEPTH - 1
        outcomes = []
        for source in (SUITE_TREES, top_k_tree_source()):
            search = run_tree_sampled_search(
                subject.make_decoder,
                subject.make_reference,
                params=plan.sampling,
                generations=GENERATIONS_PER_PROFILE * profile.sampling_generations,
                max_new_tokens=profile.max_new_tokens,
                longest_prompt=max(1, min(profile.max_prompt, LONGEST_PROMPT, room)),
                seed=plan.seed or 0,
                alpha=FALSE_FAIL_BOUND / 2,  # the check's bound split over its two configurations
                source=source,
            )
            if search.why_not is not None:
                raise NotApplicable(search.why_not)
            result.examples += len(search.runs)
            outcomes.append(inv.check(self, search))
            if outcomes[-1].violations:
                break  # the engine failed: the other configuration would only cost time
        _record(result, outcomes)


def _record(result: CheckResult, outcomes: list[Outcome]) -> None:
    """Both configurations' outcomes as the check's one result: violations of either, statistics of both."""
    violations = [v for o in outcomes for v in o.violations]
    configurations = [c for o in outcomes if o.statistics for c in o.statistics.get("configurations", [])]
    statistics = next((dict(o.statistics) for o in outcomes if o.statistics), None)
    if statistics is not None:
        statistics["configurations"] = configurations
        statistics["false_fail_bound"] = sum(c["false_fail_bound"] for c in configurations)
    result.statistics = statistics
    for outcome in outcomes:
        result.exercised += outcome.exercised
        if outcome.note:
            result.notes.extend(outcome.note.split("\n"))
    if violations:
        raise ViolationError(violations)
    if not all(o.exercised for o in outcomes):
        first = next(o for o in outcomes if not o.exercised)
        result.exercised = 0
        result.skip(first.note.split("\n")[0] if first.note else "no sampled tree token was scored")
