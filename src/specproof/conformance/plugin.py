"""The specproof pytest plugin (registered through the ``pytest11`` entry point): pytest glue only.

It adds the options that point the certifying test modules at any implementation::

    pytest --pyargs specproof.conformance --specproof-drafter mypkg.drafters:make
    pytest --pyargs specproof.conformance -k engine.kv-length --specproof-profile ci

and parametrizes those modules from the invariant registry (one pytest id per check).
Loading it in an unrelated pytest run costs an option group and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._certifying import Certification, CheckItem

_AREAS = {"test_drafter": "drafter", "test_target": "target", "test_engine": "engine"}

CERTIFICATION = pytest.StashKey["Certification"]()
"""Where a pytest session keeps its one ``Certification`` (``config.stash[CERTIFICATION]``).

``specproof certify`` puts its own there before collection; a plain ``pytest --pyargs
specproof.conformance`` run gets one made from its ``--specproof-*`` options. The
certification owns every cache of the run, so nothing carries over to the next session."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specproof", "specproof conformance (certify drafters, targets, engines)")
    group.addoption("--specproof-drafter", default=None, metavar="SPEC", help="drafter to certify (default: ngram)")
    group.addoption("--specproof-target", default=None, metavar="SPEC", help="target: reference, mlx:..., MODULE:ATTR")
    group.addoption("--specproof-engine", default=None, metavar="SPEC", help="engine: MODULE:ATTR, exec:CMD, tcp:H:P")
    group.addoption(
        "--specproof-subject",
        default=None,
        choices=("drafter", "target", "engine", "all"),
        help="what to certify (default: inferred from the options given; 'all' for the built-in stack)",
    )
    group.addoption("--specproof-profile", default="quick", help="quick | ci | release (default quick)")
    group.addoption("--specproof-only", action="append", default=[], metavar="ID", help="invariant ids or globs")
    group.addoption("--specproof-report", default=None, metavar="FILE", help="write a specproof-report/2 JSON here")
    group.addoption("--specproof-seed", default=None, type=int, help="Hypothesis seed (default: derandomized)")
    group.addoption(
        "--tie-tolerance",
        dest="specproof_tie_tolerance",
        default=None,
        type=float,
        help="top-2 logit margin below which a divergence from greedy is excused (default: the subject's own)",
    )
    group.addoption(
        "--atol",
        dest="specproof_atol",
        default=None,
        type=float,
        help="absolute tolerance on logits and recurrent state (default: the subject's own, 0 = exact)",
    )


def _certification(config: pytest.Config) -> Certification:
    cert = config.stash.get(CERTIFICATION, None)
    if cert is None:
        from specproof.conformance._certifying import Certification, Plan

        opt = config.getoption
        plan = Plan.create(
            opt("--specproof-subject"),
            drafter=opt("--specproof-drafter"),
            target=opt("--specproof-target"),
            engine=opt("--specproof-engine"),
            profile=opt("--specproof-profile"),
            seed=opt("--specproof-seed"),
            tie_tolerance=opt("specproof_tie_tolerance"),
            atol=opt("specproof_atol"),
            only=tuple(opt("--specproof-only")),
        )
        cert = Certification(plan)
        config.stash[CERTIFICATION] = cert
    return cert


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    area = _AREAS.get(metafunc.function.__name__)
    if area is None or not metafunc.module.__name__.startswith("specproof.conformance.test_"):
        return
    items = _certification(metafunc.config).checks(area)  # type: ignore[arg-type]
    if items:
        metafunc.parametrize("specproof_check", items, ids=[i.id for i in items])
    else:
        metafunc.parametrize("specproof_check", [None], ids=["not-requested"])


@pytest.fixture(scope="session")
def specproof_certification(request: pytest.FixtureRequest) -> Certification:
    return _certification(request.config)


def run_check(cert: Certification, item: CheckItem | None) -> None:
    """What every certifying test does: run the check, then turn its verdict into pytest's."""
    from specproof.contract import ViolationError

    if item is None:
        pytest.skip("not part of this certification (see --specproof-subject / --specproof-only)")
    result = cert.run(item)
    if result.status == "skip":
        pytest.skip(result.detail)
    if result.status == "fail":
        raise ViolationError(result.violations)
    if result.status == "error":
        raise RuntimeError(result.detail)
    if result.status == "xfail":
        pytest.xfail(result.detail)
    if result.status == "xpass":
        pytest.fail(result.detail)


def pytest_sessionstart(session: pytest.Session) -> None:
    cert = session.config.stash.get(CERTIFICATION, None)
    if cert is not None:
        cert.defer_results = True  # progress goes out after each test, outside pytest's capture


@pytest.hookimpl(tryfirst=True)  # a firstresult hook: run before the one that returns the report
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    # after the teardown phase pytest's capture of the test is over: a progress line reaches the log
    if call.when == "teardown":
        cert = item.config.stash.get(CERTIFICATION, None)
        if cert is not None:
            cert.hand_on_results()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    cert = session.config.stash.get(CERTIFICATION, None)
    if cert is not None:
        cert.hand_on_results()
    path = session.config.getoption("--specproof-report", default=None)
    if cert is not None and path:
        from specproof.conformance.reports import build_report, write_json_report

        write_json_report(path, build_report(cert))
