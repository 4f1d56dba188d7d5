"""The specproof pytest plugin (registered through the ``pytest11`` entry point): pytest glue only.

It adds the options that point the certifying test modules at any implementation::

    pytest --pyargs specproof.conformance --specproof-drafter mypkg.drafters:make
    pytest --pyargs specproof.conformance -k engine.kv-length --specproof-profile ci

and parametrizes those modules from the invariant registry (one pytest id per check). Its
options are ``specproof certify``'s, from the same definitions (``_options.py``), checked
before collection as ``certify`` checks its own (a bad ``--specproof-db`` is a usage error).
Loading it in an unrelated pytest run costs an option group and nothing else.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._certification import Certification
    from specproof.conformance._results import CheckResult
    from specproof.conformance.drivers import CheckItem

_AREAS = {"test_drafter": "drafter", "test_target": "target", "test_engine": "engine"}

CERTIFICATION = pytest.StashKey["Certification"]()
"""Where a pytest session keeps its one ``Certification`` (``config.stash[CERTIFICATION]``).

``specproof certify`` puts its own there before collection; a plain ``pytest --pyargs
specproof.conformance`` run gets one made from its ``--specproof-*`` options. The
certification owns every cache of the run, so nothing carries over to the next session."""


def pytest_addoption(parser: pytest.Parser) -> None:
    from specproof.conformance._options import add_to_pytest

    # the options of `specproof certify`, from the same definitions (conformance/_options.py)
    add_to_pytest(parser.getgroup("specproof", "specproof conformance (certify drafters, targets, engines)"))


def _requested(config: pytest.Config) -> bool:
    """Whether this run gave any --specproof-* option (an unrelated pytest run pays nothing)."""
    from specproof.conformance._options import OPTIONS

    return any(config.getoption("specproof_" + o.dest) not in (None, [], o.default) for o in OPTIONS)


@pytest.hookimpl(trylast=True)  # after `specproof certify` has put its own certification in the stash
def pytest_configure(config: pytest.Config) -> None:
    """Every option is checked before any work, as `certify` checks its own: the values, the
    database (a Redis server must answer) and the subjects' specs; a bad one is a usage error."""
    if CERTIFICATION in config.stash or not _requested(config):
        return
    from specproof.contract import UsageError
    from specproof.contract.errors import InvalidSettingError, PluginError

    try:
        cert = _certification(config)
    except (UsageError, PluginError, InvalidSettingError) as exc:  # what `specproof certify` exits 2 on
        raise pytest.UsageError(str(exc)) from None
    _use_hypothesis_dir(config, cert)


_HOME = pytest.StashKey[object]()  # Hypothesis' home directory before this run set it


def _use_hypothesis_dir(config: pytest.Config, cert: Certification) -> None:
    """Hypothesis keeps its files (examples, its constants cache) in ``--specproof-hypothesis-dir``
    (default $SPECPROOF_HYPOTHESIS_DIR, else the user cache), as under ``specproof certify``: never
    ``.hypothesis/`` in the working directory. Set back when the session ends."""
    from hypothesis import configuration

    from specproof.conformance._database import hypothesis_home

    config.stash[_HOME] = getattr(configuration, "__hypothesis_home_directory", None)
    configuration.set_hypothesis_home_dir(cert.plan.storage or hypothesis_home())


def pytest_unconfigure(config: pytest.Config) -> None:
    if _HOME in config.stash:
        from hypothesis import configuration

        home = config.stash[_HOME]
        configuration.set_hypothesis_home_dir(home if isinstance(home, (str, Path)) else None)


def _certification(config: pytest.Config) -> Certification:
    cert = config.stash.get(CERTIFICATION, None)
    if cert is None:
        from specproof.conformance._certification import Certification
        from specproof.conformance._options import OPTIONS
        from specproof.conformance._plan import Plan

        # the one mapping from the options to a plan, as `specproof certify` makes its own
        values = {o.dest: config.getoption("specproof_" + o.dest) for o in OPTIONS}
        cert = Certification(Plan.from_options(values, flags="plugin"))
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
    """What every certifying test does: run the check, then turn its verdict into pytest's.

    A failure's text is what ``specproof certify`` prints for it: each violation with its minimal
    example (bounded) and the command that reproduces it (``reproduce: specproof certify ...``)."""
    __tracebackhide__ = True  # the failure is the check's, not this glue's
    if item is None:
        pytest.skip("not part of this certification (see --specproof-subject / --specproof-only)")
    result = cert.run(item)
    if result.status == "skip":
        pytest.skip(result.detail)
    if result.status == "fail":
        from specproof.contract import ViolationError

        failed = ViolationError(result.violations)  # its violations, for reports; its text, certify's
        failed.args = (failure_text(result),)
        raise failed
    if result.status == "error":
        raise RuntimeError(result.detail + (f"\nreproduce: {result.reproduce}" if result.reproduce else ""))
    if result.status == "xfail":
        pytest.xfail(result.detail)
    if result.status == "xpass":
        pytest.fail(result.detail)


_EXAMPLE_CHARS = 3000  # a minimal example's JSON in a failure's text, as `specproof certify` prints it


def failure_text(result: CheckResult) -> str:
    """A failing check as ``specproof certify`` prints it: each violation (explanation, expected and
    actual), its minimal example as JSON (at most ``_EXAMPLE_CHARS`` characters), then the reproduce line."""
    import json

    lines = []
    for v in result.violations:
        lines.append(str(v))
        if v.example:
            example = json.dumps(v.to_json()["example"], default=str)
            cut = example if len(example) <= _EXAMPLE_CHARS else example[: _EXAMPLE_CHARS - 3] + "..."
            lines.append(f"    minimal example: {cut}")
    if result.reproduce:
        lines.append(f"reproduce: {result.reproduce}")
    return "\n".join(lines) or result.detail


@pytest.hookimpl(tryfirst=True)  # before the terminal reporter formats the traceback
def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """A Ctrl-C or SIGTERM can land on an instruction that has no line number (Python 3.11+: the
    cleanup of an exception handler, e.g. a ``with`` block's ``__exit__`` seeing an exception); its
    traceback entry's ``tb_lineno`` is then None, and pytest's formatting of the interrupt fails
    on it (``TypeError`` in ``_pytest/_code/code.py``), which ended the run with a traceback and no
    report. Those entries, here and in the chained exceptions, are dropped before pytest formats it."""
    excinfo.traceback = excinfo.traceback.filter(_has_line)
    seen = {id(excinfo.value)}
    chained = excinfo.value.__cause__ or excinfo.value.__context__
    while chained is not None and id(chained) not in seen:  # (pytest formats the chain from __traceback__)
        seen.add(id(chained))
        chained.__traceback__ = _with_lines(chained.__traceback__)
        chained = chained.__cause__ or chained.__context__


def _has_line(entry: Any) -> bool:
    try:
        entry.lineno  # noqa: B018  # (what pytest's formatting computes: None - 1 without a line)
    except TypeError:
        return False
    return True


def _with_lines(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without its entries at an instruction with no line number."""
    if tb is None:
        return None
    rest = _with_lines(tb.tb_next)
    if tb.tb_lineno is None:  # type: ignore[comparison-overlap]  # (typeshed: int; None since 3.11)
        return rest
    return TracebackType(rest, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)


def pytest_sessionstart(session: pytest.Session) -> None:
    cert = session.config.stash.get(CERTIFICATION, None)
    if cert is not None:
        cert.defer_results = True  # progress goes out after each test, outside pytest's capture
        from specproof.conformance._waiting import set_sink

        # a check waiting on an engine says so while it waits, outside pytest's capture of the check
        session.config.stash[_SINK] = set_sink(lambda text: _outside_capture(session.config, text))


_SINK = pytest.StashKey[object]()  # the waiting-line sink before this session set its own


def _outside_capture(config: pytest.Config, text: str) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print(text, file=sys.stderr, flush=True)


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
    opt = session.config.getoption
    json_path, markdown_path = opt("specproof_report", default=None), opt("specproof_markdown", default=None)
    if cert is not None and (json_path or markdown_path):
        from specproof.conformance.reports import build_report, write_json_report, write_markdown_report

        report = build_report(cert)
        if json_path:
            write_json_report(json_path, report)
        if markdown_path:
            write_markdown_report(markdown_path, report)
    if cert is not None:
        cert.cache.clear()  # the checks are over: nothing may hold the run's models after it
    if _SINK in session.config.stash:
        from specproof.conformance._waiting import set_sink

        set_sink(session.config.stash[_SINK])  # type: ignore[arg-type]
