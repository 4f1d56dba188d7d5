"""The ``rollback-machine`` driver: the built-in decoder under Hypothesis' stateful testing.

One ``RollbackMachine`` drives ``SpecDecoder`` on the suite's target with every rollback
strategy of the built-in cases (drawn per conversation): half the cost of a machine per
strategy, the same rules. It drafts with its own script, so it says nothing about a
drafter under certification (a drafter subject gets no such check).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from specproof.conformance import _registry as registry
from specproof.conformance._subjects import Suite
from specproof.conformance.drivers._protocol import CheckItem, Driver
from specproof.contract import SpecproofError, ViolationError

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._results import CheckResult

__all__ = ["RollbackMachineDriver"]


class RollbackMachineDriver(Driver):
    """One machine for all the built-in engine cases (check id ``checkpoint+replay-...``)."""

    name = "rollback-machine"

    @classmethod
    def checks(cls, invariant: registry.Invariant, suite: Suite) -> Iterator[CheckItem]:
        builtin = [c for c in suite.engines if c.kind == "builtin"]
        if builtin and suite.subject != "drafter":
            yield CheckItem(invariant, "+".join(c.id for c in builtin), builtin[0])

    def run(self, item: CheckItem, result: CheckResult) -> None:
        from specproof.strategies import RollbackMachine, RollbackMachineFailure

        tsub = self.plan.suite.target
        assert tsub is not None and item.engine is not None
        rollbacks = tuple(c.rollback or "replay" for c in self.plan.suite.engines if c.kind == "builtin")
        inv = item.invariant
        machine = RollbackMachine.configure(
            target_factory=tsub.make,
            tolerance=tsub.atol,
            rollbacks=rollbacks,
            judges=self.context.cache.judges,
            sampled_rounds=self.plan.sampling is not None,  # --sampling: sampled rounds too
            tree_rounds=self.plan.trees,  # --trees: tree rounds too, on a target with forward_tree
        )

        class Counted(machine):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                result.examples += 1
                result.exercised += 1
                super().__init__()

        try:
            self.context.replay.run_machine(Counted, item)
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
