"""specproof.conformance: the invariant registry, the certify core, the pytest plugin, reports and traces.

Public entry points:

- ``REGISTRY`` / ``Invariant`` — every check's id, subject, summary and needs (one source of truth;
  ``specproof invariants`` prints it);
- ``checks`` — every invariant as a function returning structured violations;
- ``certify(...)`` / ``check_subject(...)`` — run the certifying checks in-process and get a
  ``specproof-report/2`` dict (``certify``) or the per-check results (``check_subject``);
- ``traces`` — the ``specproof-trace/1`` format and ``check_trace``;
- ``zoo`` — deliberately broken implementations the suite must reject;
- the pytest plugin (``pytest --pyargs specproof.conformance --specproof-drafter ...``).
"""

from __future__ import annotations

from typing import Any

from specproof.conformance._registry import REGISTRY, Invariant, Outcome, markdown_table
from specproof.contract import Violation, ViolationError

__all__ = ["REGISTRY", "Invariant", "Outcome", "Violation", "ViolationError", "certify", "markdown_table"]


def certify(
    subject: str | None = None,
    *,
    drafter: str | None = None,
    target: str | None = None,
    engine: str | None = None,
    profile: str = "quick",
    seed: int | None = None,
    tie_tolerance: float | None = None,
    atol: float | None = None,
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Certify plug-ins given as specs (as ``specproof certify`` does); returns the report dict.

    Options are validated before anything runs: a bad one raises ``specproof.contract.UsageError``.
    """
    from specproof.conformance._certifying import Plan
    from specproof.conformance._runner import certify as run

    plan = Plan.create(
        subject,
        drafter=drafter,
        target=target,
        engine=engine,
        profile=profile,
        seed=seed,
        tie_tolerance=tie_tolerance,
        atol=atol,
        only=only,
    )
    return run(plan)[1]
