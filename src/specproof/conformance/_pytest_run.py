"""Run a plan's checks in-process through pytest (the certifying test modules) and build the report.

pytest is the one runner (so ``specproof certify`` and ``pytest --pyargs specproof.conformance``
are one implementation); the checks, their verdicts and the report come from the
``Certification`` the plan made.
"""

from __future__ import annotations

import gc
import io
import os
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from specproof.conformance._certification import Certification
from specproof.conformance._plan import Plan
from specproof.conformance._results import CheckResult, Report
from specproof.conformance.plugin import CERTIFICATION
from specproof.conformance.reports import build_report

# the conformance package's folder (its test modules run under pytest from there)
_PACKAGE_DIR = str(Path(__file__).parent)

__all__ = ["MODULES", "certify"]

MODULES = ("test_drafter", "test_target", "test_engine")


def certify(
    plan: Plan,
    *,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> tuple[Certification, Report]:
    """Run every check ``plan`` selects; returns the certification and its report."""
    cert = Certification(plan, on_result=on_result)
    if on_start is not None:
        on_start(len(cert.all_checks()))
    args = [f"{_PACKAGE_DIR}/{m}.py" for m in MODULES]
    args += [
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-p",
        "no:benchmark",
        # plug-ins a certification never uses, each an import (and an assertion rewrite) per run
        "-p",
        "no:xdist",
        "-p",
        "no:xdist.looponfail",
        "-p",
        "no:platformdirs",
        "-q",
        "--no-header",
        "-rN",
        "--tb=no",
        "--disable-warnings",
        "-p",
        "no:logging",
        "--override-ini=addopts=",
        "--override-ini=python_files=test_*.py",
        f"--rootdir={_PACKAGE_DIR}",
    ]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):  # the pytest11 entry point is not loaded then
        args += ["-p", "specproof.conformance.plugin"]

    class _Inject:
        @pytest.hookimpl(tryfirst=True)
        def pytest_configure(self, config: pytest.Config) -> None:
            config.stash[CERTIFICATION] = cert  # the plugin's checks run on this certification

    sink = io.StringIO()
    # what exists now (modules, classes, the loaded subjects) outlives the run: the collector's full
    # passes skip it until the run ends (about a third of a quick run's collection time)
    gc.freeze()
    # the user's PYTEST_ADDOPTS are for their own pytest runs: this one takes only the options above (an ``-n 4``
    # there would be an unknown option here, and a ``-x`` would end the certification at its first failure)
    user_addopts = os.environ.pop("PYTEST_ADDOPTS", None)
    try:
        with redirect_stdout(sink):
            code = pytest.main(args, plugins=[_Inject()])
    except KeyboardInterrupt:
        code = pytest.ExitCode.INTERRUPTED
    finally:
        if user_addopts is not None:
            os.environ["PYTEST_ADDOPTS"] = user_addopts
        gc.unfreeze()
        plan.close()
    if code == pytest.ExitCode.INTERRUPTED:
        cert.interrupted = True
    report = build_report(cert)
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.INTERRUPTED):
        report["verdict"] = "fail"
        report["verdict_reason"] = f"the certifying run itself failed (pytest exit {int(code)})"
        report["pytest_output"] = sink.getvalue()[-4000:]
    return cert, Report.from_json(report)
