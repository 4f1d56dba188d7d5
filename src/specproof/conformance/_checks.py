"""The check generator: registry x subjects x ``--only`` -> check items (pure: nothing runs).

Like scikit-learn's ``estimator_checks_generator``: ``certify``, the pytest plugin,
``parametrize_with_checks`` and ``specproof fuzz`` all take their checks from here, so a
check has one id everywhere. Each invariant's driver says on which subject cases it runs
(``Driver.checks``: one per engine case by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from specproof.conformance import _registry as registry
from specproof.conformance.drivers import CheckItem, driver_class

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._plan import Plan

__all__ = ["generate_checks"]


def generate_checks(
    plan: Plan, subject: registry.Subject, *, invariants: Iterable[registry.Invariant] | None = None
) -> Iterator[CheckItem]:
    """The checks of one area (``drafter``, ``target``, ``engine``) a plan selects, in registry order
    (``invariants``: another registry's entries; by default the project's ``REGISTRY``)."""
    for inv in registry.by_subject(subject) if invariants is None else invariants:
        if inv.subject != subject or (plan.only and inv.id not in plan.only):
            continue
        yield from driver_class(inv.driver).checks(inv, plan.suite)
