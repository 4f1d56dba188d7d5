"""specproof.conformance: the invariants, certifying test modules, pytest plugin, reports and traces.

Public entry points:

- ``CATALOGUE`` / ``INVARIANT_IDS`` / ``Violation`` — the invariant catalogue of DESIGN.md;
- ``checks`` — every invariant as a function returning structured violations;
- ``certify(...)`` — run the certifying modules in-process and get a ``specproof-report/1`` dict;
- ``traces`` — the ``specproof-trace/1`` format and ``check_trace``;
- ``zoo`` — deliberately broken implementations the suite must reject;
- the pytest plugin (``pytest --pyargs specproof.conformance --specproof-drafter ...``).
"""

from __future__ import annotations

from typing import Any

from specproof.conformance._invariants import CATALOGUE, INVARIANT_IDS, Invariant, Violation, ViolationError

__all__ = ["CATALOGUE", "INVARIANT_IDS", "Invariant", "Violation", "ViolationError", "certify"]


def certify(
    subject: str | None = None,
    *,
    drafter: str | None = None,
    target: str | None = None,
    engine: str | None = None,
    profile: str = "quick",
    seed: int | None = None,
    tie_tolerance: float | None = None,
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Certify plug-ins given as specs (as ``specproof certify`` does); returns the report dict."""
    from specproof.conformance._certifying import CertifyContext
    from specproof.conformance._runner import certify as run

    ctx = CertifyContext.create(
        subject, drafter=drafter, target=target, engine=engine, profile=profile, seed=seed, tie_tolerance=tie_tolerance
    )
    return run(ctx, only=only)
