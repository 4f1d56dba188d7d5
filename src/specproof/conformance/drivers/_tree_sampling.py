"""The ``tree-sampling`` driver: the sampled tree search of each engine case that verifies trees
(docs/contract.md, "Sampled trees").

It runs with ``--trees`` and ``--sampling`` both given (else a skip saying which is missing), on the cases
the ``tree-cases`` driver takes (the built-in tree decoder on the reference hybrid; a plug-in engine's
``tree_decoder``) whose tree decoder's ``generate`` takes ``sampling=``. One search per engine case:
``GENERATIONS_PER_PROFILE`` times the profile's sampled generation budget, the profile's generation length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specproof.conformance._sequential import FALSE_FAIL_BOUND
from specproof.conformance._tree_sampled_runs import MAX_DEPTH, run_tree_sampled_search
from specproof.conformance.drivers._protocol import CheckItem, NotApplicable
from specproof.conformance.drivers._trees import TreeDriver
from specproof.contract import ViolationError

if TYPE_CHECKING:  # pragma: no cover
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
        search = run_tree_sampled_search(
            subject.make_decoder,
            subject.make_reference,
            params=plan.sampling,
            generations=GENERATIONS_PER_PROFILE * profile.sampling_generations,
            max_new_tokens=profile.max_new_tokens,
            longest_prompt=max(1, min(profile.max_prompt, LONGEST_PROMPT, room)),
            seed=plan.seed or 0,
            alpha=FALSE_FAIL_BOUND,
        )
        if search.why_not is not None:
            raise NotApplicable(search.why_not)
        outcome = inv.check(self, search)
        result.examples += len(search.runs)
        result.exercised += outcome.exercised
        result.statistics = outcome.statistics
        if outcome.note:
            result.notes.extend(outcome.note.split("\n"))
        if outcome.violations:
            raise ViolationError(outcome.violations)
        if not outcome.exercised:
            result.skip(outcome.note.split("\n")[0] if outcome.note else "no sampled tree token was scored")
