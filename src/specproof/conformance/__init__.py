"""specproof.conformance: the invariant registry, the certify core, the pytest plugin, reports and traces.

Public entry points:

- ``REGISTRY`` / ``Invariant`` — every check's id, subject, summary and needs (one source of truth;
  ``specproof invariants`` prints it);
- ``checks`` — every invariant as a function returning structured violations;
- ``certify(...)`` — run the certifying checks in-process and get a ``Report`` (its
  ``to_json()`` is the report document, ``specproof.formats.report``);
- ``Driver`` / ``register_driver`` — the kinds of search behind the checks (docs/contract.md, "Drivers");
- ``traces`` — traces (``specproof.formats.trace``) and ``check_trace``;
- ``zoo`` — deliberately broken implementations the suite must reject;
- the pytest plugin (``pytest --pyargs specproof.conformance --specproof-drafter ...``).
"""

from __future__ import annotations

from typing import Any

from specproof.conformance._campaign import CampaignOptions, max_workers, run_campaign
from specproof.conformance._certification import Certification
from specproof.conformance._database import default_examples_dir, open_database, storage_dir
from specproof.conformance._options import SUBJECT_OPTIONS, add_to_argparse, plan_arguments
from specproof.conformance._plan import Plan
from specproof.conformance._pytest_run import certify as run_plan
from specproof.conformance._records import CAPABILITIES, Capabilities, RunRecord
from specproof.conformance._registry import (
    REGISTRY,
    Invariant,
    Outcome,
    check_generation,
    get,
    markdown_table,
    registry_json,
    select,
)
from specproof.conformance._results import CheckResult, Report
from specproof.conformance.drivers import DRIVERS, CheckItem, Driver, DriverContext, register_driver
from specproof.contract import Violation, ViolationError

__all__ = [
    "CAPABILITIES",
    "DRIVERS",
    "REGISTRY",
    "SUBJECT_OPTIONS",
    "CampaignOptions",
    "Capabilities",
    "Certification",
    "CheckItem",
    "CheckResult",
    "Driver",
    "DriverContext",
    "Invariant",
    "Outcome",
    "Plan",
    "Report",
    "RunRecord",
    "Violation",
    "ViolationError",
    "certify",
    "check",
    "add_to_argparse",
    "check_generation",
    "default_examples_dir",
    "get",
    "markdown_table",
    "max_workers",
    "open_database",
    "parametrize_with_checks",
    "plan_arguments",
    "register_driver",
    "registry_json",
    "run_campaign",
    "run_plan",
    "select",
    "storage_dir",
]


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
    db: str | None = None,
    db_replay: str = "all",
    expected_failures: dict[str, str] | None = None,
    sampling: str | None = None,
) -> Report:
    """Certify plug-ins given as specs (as ``specproof certify`` does); returns the ``Report``.

    Options are validated before anything runs: a bad one raises ``specproof.contract.UsageError``.
    ``db`` is an example database (a directory, or ``redis://HOST:PORT/N`` beside the default
    directory) that failures are saved in and replayed from first; here the default is none
    (the CLI's default is a directory under the cache); ``db_replay="failures"`` replays saved
    failures only, not the covering examples campaigns saved (``--db-replay``). ``sampling``
    (``"temperature=0.8,top_p=0.95"``) runs the sampling checks too (``--sampling``).
    """

    values = {
        "subject": subject,
        "drafter": drafter,
        "target": target,
        "engine": engine,
        "profile": profile,
        "seed": seed,
        "tie_tolerance": tie_tolerance,
        "atol": atol,
        "only": only,
        "sampling": sampling,
    }
    database = open_database(db, default_dir=default_examples_dir(), replay=db_replay) if db is not None else None
    plan = Plan.create(**plan_arguments(values), database=database, expected_failures=expected_failures)
    return run_plan(plan)[1]


def parametrize_with_checks(**options: Any) -> Any:
    """A ``pytest.mark.parametrize`` over every check ``certify(**options)`` would run, one id per check.

    For a third party's own test suite (scikit-learn's ``parametrize_with_checks``)::

        from specproof.conformance import check, parametrize_with_checks

        @parametrize_with_checks(engine="mypkg.engine:make", profile="ci")
        def test_specproof(specproof_check):
            check(specproof_check)

    The checks come from the same generator as ``certify`` (the registry and the plan), and
    options are validated when the decorator is built.
    """
    import pytest

    cert = Certification(Plan.create(options.pop("subject", None), **options))
    items = cert.all_checks()
    return pytest.mark.parametrize("specproof_check", [pytest.param((cert, i), id=i.id) for i in items])


def check(specproof_check: tuple[Certification, CheckItem]) -> None:
    """Run one check from ``parametrize_with_checks`` and turn its verdict into pytest's (skip / fail)."""
    from specproof.conformance.plugin import run_check

    cert, item = specproof_check
    run_check(cert, item)
