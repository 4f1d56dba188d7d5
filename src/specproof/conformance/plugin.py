"""The specproof pytest plugin (registered through the ``pytest11`` entry point).

It adds the options that point the certifying test modules at any implementation::

    pytest --pyargs specproof.conformance --specproof-drafter mypkg.drafters:make
    pytest --pyargs specproof.conformance -k engine.kv-length --specproof-profile ci

and nothing else: loading it in an unrelated pytest run costs an option group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._certifying import CertifyContext


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specproof", "specproof conformance (certify drafters, targets, engines)")
    group.addoption(
        "--specproof-drafter",
        default=None,
        metavar="MODULE:ATTR",
        help="drafter to certify (a factory or an instance); default: the built-in n-gram drafter",
    )
    group.addoption(
        "--specproof-target",
        default=None,
        metavar="SPEC",
        help="target to certify / run engines on: reference, mlx:..., hf:..., MODULE:ATTR",
    )
    group.addoption(
        "--specproof-engine",
        default=None,
        metavar="MODULE:ATTR",
        help="engine to certify (white-box with steps, or black-box with target/greedy)",
    )
    group.addoption(
        "--specproof-subject",
        default=None,
        choices=("drafter", "target", "engine", "all"),
        help="what to certify (default: inferred from the options given; 'all' for the built-in stack)",
    )
    group.addoption("--specproof-profile", default="quick", help="quick | ci | release (default quick)")
    group.addoption(
        "--specproof-report", default=None, metavar="FILE", help="write a specproof-report/1 JSON report here"
    )
    group.addoption(
        "--specproof-seed",
        default=None,
        type=int,
        help="Hypothesis seed (default: derandomized, the same examples every run)",
    )
    group.addoption(
        "--tie-tolerance",
        dest="specproof_tie_tolerance",
        default=None,
        type=float,
        help="top-2 logit margin below which a divergence from greedy is excused (default: the "
        "target's own tie_tolerance, 0 = exact)",
    )


def _context(config: pytest.Config) -> CertifyContext:
    ctx = getattr(config, "_specproof_context", None)
    if ctx is None:
        from specproof.conformance._certifying import CertifyContext

        ctx = CertifyContext.from_pytest_config(config)
        config._specproof_context = ctx  # type: ignore[attr-defined]
    return ctx


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not metafunc.module.__name__.startswith("specproof.conformance.test_"):
        return
    ctx = _context(metafunc.config)
    params = ctx.parametrize(metafunc.function.__name__)
    metafunc.parametrize("specproof_check", [p for _, p in params], ids=[i for i, _ in params])


@pytest.fixture(scope="session")
def specproof_context(request: pytest.FixtureRequest) -> CertifyContext:
    return _context(request.config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    ctx = getattr(item.config, "_specproof_context", None)
    if ctx is not None and call.when == "call":
        ctx.observe(item.nodeid, call, outcome.get_result())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ctx = getattr(session.config, "_specproof_context", None)
    path = session.config.getoption("--specproof-report", default=None)
    if ctx is not None and path:
        from specproof.conformance.reports import write_json_report

        write_json_report(path, ctx.report())
