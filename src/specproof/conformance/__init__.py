"""specproof.conformance: the invariant registry, the certify core, the pytest plugin, reports and traces.

Public entry points:

- ``REGISTRY`` / ``Invariant`` — every check's id, subject, summary and needs (one source of truth;
  ``specproof invariants`` prints it); ``get(id)`` one invariant, ``select(patterns)`` the ids and
  globs ``--only`` takes;
- ``checks`` — every invariant as a function returning structured violations;
- ``certify(...)`` — run the certifying checks in-process and get a ``Report`` (its
  ``to_json()`` is the report document, ``specproof.formats.report``);
- ``Driver`` / ``register_driver`` — the kinds of search behind the checks (docs/contract.md, "Drivers");
- ``traces`` — traces (``specproof.formats.trace``) and ``check_trace``;
- ``zoo`` — deliberately broken implementations the suite must reject;
- the pytest plugin (``pytest --pyargs specproof.conformance --specproof-drafter ...``).

What only specproof's command line needs is in ``cli_support``, which is not API.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from specproof.conformance import _database, _options, _pytest_run
from specproof.conformance._certification import Certification
from specproof.conformance._plan import Plan
from specproof.conformance._records import CAPABILITIES, Capabilities, RunRecord
from specproof.conformance._registry import (
    REGISTRY,
    Invariant,
    Outcome,
    check_generation,
    get,
    select,
)
from specproof.conformance._results import CheckResult, Report
from specproof.conformance.drivers import DRIVERS, CheckItem, Driver, DriverContext, register_driver
from specproof.contract import Violation, ViolationError

__all__ = [
    "CAPABILITIES",
    "DRIVERS",
    "REGISTRY",
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
    "check_generation",
    "get",
    "parametrize_with_checks",
    "register_driver",
    "select",
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
    batches: bool = False,
    decode_state: bool = False,
    trees: bool = False,
) -> Report:
    """Certify plug-ins given as specs (as ``specproof certify`` does); returns the ``Report``.

    Options are validated before anything runs: a bad one raises ``specproof.contract.UsageError``.
    ``db`` is an example database (a directory, or ``redis://HOST:PORT/N`` beside the default
    directory) that failures are saved in and replayed from first; here the default is none
    (the CLI's default is a directory under the cache); ``db_replay="failures"`` replays saved
    failures only, not the covering examples campaigns saved (``--db-replay``). ``sampling``
    (``"temperature=0.8,top_p=0.95"``) runs the sampling checks too (``--sampling``); ``batches``
    the batch checks (``--batches``); ``decode_state`` the decode-state checks (``--decode-state``);
    ``trees`` the tree checks (``--trees``).
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
        "batches": batches,
        "decode_state": decode_state,
        "trees": trees,
    }
    database = (
        _database.open_database(db, default_dir=_database.default_examples_dir(), replay=db_replay)
        if db is not None
        else None
    )
    plan = Plan.create(**_options.plan_arguments(values), database=database, expected_failures=expected_failures)
    return _pytest_run.certify(plan)[1]


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


#: Names this facade exported in 0.1.0 that only the command line needs, and what to use instead.
#: They still resolve, with a ``DeprecationWarning`` (docs/contract.md, "Deprecation rule"); the
#: command line imports them from ``cli_support``.
_DEPRECATED = {
    "markdown_table": "`specproof invariants --markdown`",
    "registry_json": "`specproof invariants --json`",
    "run_plan": "specproof.certify(...)",
}

if not TYPE_CHECKING:  # type checkers see the names as gone, which they are from the public API

    def __getattr__(name: str) -> Any:
        if name not in _DEPRECATED:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"specproof.conformance.{name} is deprecated and will be removed (it was for specproof's "
            f"command line): use {_DEPRECATED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module("specproof.conformance.cli_support"), name)
