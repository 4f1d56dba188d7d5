"""``certify()``: run the certifying test modules in-process through pytest and collect the report."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from typing import Any

import pytest

from specproof.conformance._certifying import CertifyContext
from specproof.conformance._harness import clear_caches

__all__ = ["MODULES", "certify"]

MODULES = ("test_drafter", "test_target", "test_engine", "test_stateful")


class _Progress:
    """A pytest plugin that reports each finished certifying test to a callback."""

    def __init__(self, on_collect: Callable[[int], None] | None, on_result: Callable[[str], None] | None) -> None:
        self.on_collect = on_collect
        self.on_result = on_result

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.on_collect:
            self.on_collect(len(session.items))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.on_result and (report.when == "call" or (report.when == "setup" and report.skipped)):
            self.on_result(report.nodeid)


def certify(
    ctx: CertifyContext,
    *,
    only: Sequence[str] = (),
    on_collect: Callable[[int], None] | None = None,
    on_result: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every certifying check of ``ctx`` (or those whose id contains one of ``only``); returns the report."""
    import specproof.conformance as pkg

    args = [f"{pkg.__path__[0]}/{m}.py" for m in MODULES]
    args += [
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-q",
        "--no-header",
        "-rN",
        "--tb=no",
        "--disable-warnings",
        "-p",
        "no:logging",
        "--override-ini=addopts=",
        "--override-ini=python_files=test_*.py",
        f"--rootdir={pkg.__path__[0]}",
    ]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):  # the pytest11 entry point is not loaded then
        args += ["-p", "specproof.conformance.plugin"]
    if only:
        args += ["-k", " or ".join(only)]

    class _Inject:
        @pytest.hookimpl(tryfirst=True)
        def pytest_configure(self, config: pytest.Config) -> None:
            config._specproof_context = ctx  # type: ignore[attr-defined]

    clear_caches()
    sink = io.StringIO()
    with redirect_stdout(sink):
        code = pytest.main(args, plugins=[_Inject(), _Progress(on_collect, on_result)])
    report = ctx.report()
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        report["verdict"] = "error"
        report["pytest_output"] = sink.getvalue()[-4000:]
    return report
