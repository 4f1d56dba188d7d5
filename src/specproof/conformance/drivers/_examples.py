"""The ``examples`` driver: each drafter or target invariant's own Hypothesis search over its ``draw``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import hypothesis
from hypothesis import strategies as st

from specproof.conformance import _registry as registry
from specproof.conformance._records import Capabilities
from specproof.conformance._subjects import Suite
from specproof.conformance.checks.features import feature_layers_of
from specproof.conformance.drivers._protocol import CheckItem, Driver
from specproof.contract import ViolationError

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._results import CheckResult

__all__ = ["ExamplesDriver"]


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
        if callable(getattr(drafter, "propose_tree", None)):
            has.add("tree_drafter")
        return Capabilities(
            has=has,
            why_not={
                "feature_layers": "not a feature drafter (it declares no feature_layers)",
                "feature_target_spec": "the feature drafter names no feature_target_spec to compute its features with",
                "tree_drafter": "not a tree drafter (it has no propose_tree)",
            },
        )


class ExamplesDriver(Driver):
    """One Hypothesis search per drafter or target invariant, drawing with the invariant's ``draw``."""

    name = "examples"

    @classmethod
    def checks(cls, invariant: registry.Invariant, suite: Suite) -> Iterator[CheckItem]:
        if invariant.subject == "drafter" and suite.certify_drafter:
            yield CheckItem(invariant, "drafter")
        elif invariant.subject == "target" and suite.certify_target:
            yield CheckItem(invariant, "target")
        elif invariant.subject == "engine":
            yield from super().checks(invariant, suite)

    def _case(self, item: CheckItem) -> Any:
        suite = self.plan.suite
        if item.invariant.subject == "drafter":
            assert suite.drafter is not None
            vocab = suite.target.vocab_size if suite.target else 256
            return _DrafterCase(suite.drafter.make, vocab)
        assert suite.target is not None
        return suite.target

    def run(self, item: CheckItem, result: CheckResult) -> None:
        self._run_examples(item, result)

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
            result.relations.update(outcome.relations)
            if outcome.note:
                notes.append(outcome.note)
            if outcome.violations:
                raise ViolationError(outcome.violations)

        n = profile.capacity_examples if inv.budget == "capacity" else None
        self.context.replay.settings(search, max_examples=n, item=item)()
        if not result.exercised:
            result.skip(notes[0] if notes else "no example reached this check")
