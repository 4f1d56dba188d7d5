"""Declarations that mean something (issue 27): ``--expect-fail`` names a check that runs, once.

- a declaration for a check the plan does not run (deselected by ``--only``, another subject's
  invariant) is a usage error before any work (exit 2, nothing written); one whose check ran
  but was skipped makes the verdict INCONCLUSIVE, naming the declaration;
- a run whose only non-skip results are ``xfail`` is INCONCLUSIVE, not PASS: no check passed;
- an id declared twice (options, file, or both) is a usage error naming both places;
- an ``--expect-fail-file`` that is not a regular file (a FIFO, a device) is refused before it
  is opened: opening a FIFO blocks until a writer comes.

Each rule has its control: the correct declaration is still accepted.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from specproof.cli import main
from specproof.conformance import _expected
from specproof.conformance._expected import load_expected_failures, parse_expected_failures
from specproof.contract import UsageError

BROKEN = "specproof.conformance.zoo:too_long"  # fails drafter.max-length, passes drafter.token-range


def _certify(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    code = main(["certify", "drafter", "--drafter", BROKEN, "--report", str(out), *args])
    return code, json.loads(out.read_text()) if out.exists() else {}


# ---- a declaration for a check that does not run ----------------------------------------------


@pytest.mark.parametrize(
    ("only", "declared", "message"),
    [
        ("drafter.token-range", "drafter.max-length", r"drafter.max-length: that check does not run \(--only selects"),
        # a target invariant: `certify drafter` runs none (the target is used, not certified)
        ("drafter.max-length,target.shape", "target.shape", r"target.shape: .*no check of `certify drafter`"),
    ],
)
def test_a_declaration_for_a_check_that_does_not_run_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], only: str, declared: str, message: str
) -> None:
    code, report = _certify(tmp_path, "--only", only, "--expect-fail", declared)
    assert code == 2 and report == {}  # refused before any work: nothing ran, nothing written
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(message, err), err


def test_a_declaration_whose_check_was_skipped_is_inconclusive_naming_it(tmp_path: Path) -> None:
    # drafter.features runs on every drafter and skips one that declares no feature layers
    code, report = _certify(
        tmp_path,
        "--only",
        "drafter.max-length,drafter.token-range,drafter.features",
        "--expect-fail",
        "drafter.max-length=k+1",
        "--expect-fail",
        "drafter.features=stale rows",
    )
    assert code == 3 and report["verdict"] == "inconclusive", report["verdict_reason"]
    status = {r["invariant"]: r["status"] for r in report["results"]}
    assert status == {"drafter.max-length": "xfail", "drafter.token-range": "pass", "drafter.features": "skip"}
    reason = report["verdict_reason"]
    assert "--expect-fail drafter.features (stale rows)" in reason and "skipped: not a feature drafter" in reason
    assert "drafter.max-length" not in reason  # that declaration met its failure


def test_a_declaration_whose_check_failed_as_declared_is_accepted(tmp_path: Path) -> None:
    code, report = _certify(
        tmp_path, "--only", "drafter.max-length,drafter.token-range", "--expect-fail", "drafter.max-length=k+1"
    )
    assert code == 0 and report["verdict"] == "pass", report["verdict_reason"]


# ---- xfail is no pass -------------------------------------------------------------------------


def test_a_run_of_only_declared_failures_is_not_a_pass(tmp_path: Path) -> None:
    code, report = _certify(tmp_path, "--only", "drafter.max-length", "--expect-fail", "drafter.max-length")
    assert [r["status"] for r in report["results"]] == ["xfail"]
    assert code == 3 and report["verdict"] == "inconclusive"
    assert "drafter (its only non-skip results are declared failures, xfail)" in report["verdict_reason"]


def test_skips_beside_the_xfail_do_not_make_it_a_pass(tmp_path: Path) -> None:
    code, report = _certify(
        tmp_path, "--only", "drafter.max-length,drafter.features", "--expect-fail", "drafter.max-length"
    )
    assert sorted(r["status"] for r in report["results"]) == ["skip", "xfail"]
    assert code == 3 and "declared failures, xfail" in report["verdict_reason"]


# ---- duplicates -------------------------------------------------------------------------------


def test_an_id_declared_twice_on_the_command_line_is_refused_naming_both() -> None:
    with pytest.raises(
        UsageError,
        match=r"drafter.max-length is declared an expected failure twice: "
        r"--expect-fail 'drafter.max-length=one' and --expect-fail 'drafter.max-length=two'",
    ):
        parse_expected_failures(["drafter.max-length=one", "drafter.max-length=two"])
    with pytest.raises(UsageError, match="twice"):  # the same reason is no excuse: one declaration, one place
        parse_expected_failures(["engine.stop", "engine.stop"])


def test_an_id_declared_twice_in_the_file_is_refused_naming_both_lines(tmp_path: Path) -> None:
    declared = tmp_path / "xfails.txt"
    declared.write_text("drafter.max-length first reason\n# ...\nengine.stop\ndrafter.max-length=second\n")
    with pytest.raises(UsageError, match=r"twice: .*xfails.txt:1 and .*xfails.txt:4"):
        load_expected_failures(declared)


def test_an_id_in_the_file_and_on_the_command_line_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    declared = tmp_path / "xfails.txt"
    declared.write_text("drafter.max-length from the file\n")
    with pytest.raises(UsageError, match=r"twice: .*xfails.txt:1 and --expect-fail 'drafter.max-length=cli'"):
        _expected.declared_failures(declared, ["drafter.max-length=cli"])
    code, report = _certify(
        tmp_path,
        "--only",
        "drafter.max-length,drafter.token-range",
        "--expect-fail-file",
        str(declared),
        "--expect-fail",
        "drafter.max-length=cli",
    )
    assert code == 2 and report == {} and "twice" in capsys.readouterr().err


def test_distinct_declarations_from_the_file_and_the_command_line_are_kept(tmp_path: Path) -> None:
    declared = tmp_path / "xfails.txt"
    declared.write_text("drafter.max-length from the file\n")
    assert _expected.declared_failures(declared, ["engine.stop=cli"]) == {
        "drafter.max-length": "from the file",
        "engine.stop": "cli",
    }
    assert _expected.declared_failures(None, ()) == {}


# ---- a file that is not a regular file --------------------------------------------------------


@pytest.fixture
def never_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a FIFO in a way that blocks (``open``, or ``os.open`` without ``O_NONBLOCK``) in the
    one reader of user files (``contract.files.read_bounded_text``, which ``--expect-fail-file``
    goes through) fails the test rather than blocking on it (so a regression fails, not hangs)."""
    from specproof.contract import files

    real_os_open = os.open

    def is_fifo(path: object) -> bool:
        try:
            return stat.S_ISFIFO(os.stat(path).st_mode)  # type: ignore[arg-type]
        except (OSError, TypeError, ValueError):
            return False

    def guarded_os_open(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if is_fifo(path) and not flags & os.O_NONBLOCK:
            raise AssertionError(f"{path} was opened blocking: it must be refused before any read")
        return real_os_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    def guarded_open(path: object, *args: object, **kwargs: object) -> object:
        if is_fifo(path):
            raise AssertionError(f"{path} was opened: it must be refused before any read")
        return open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(files.os, "open", guarded_os_open)
    monkeypatch.setattr(files, "open", guarded_open, raising=False)
    monkeypatch.setattr(_expected, "open", guarded_open, raising=False)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_before_it_is_opened(
    tmp_path: Path, never_opened: None, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "xfails.fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match=r"xfails.fifo'?: not a regular file \(a FIFO\)"):
        load_expected_failures(fifo)
    code, report = _certify(tmp_path, "--expect-fail-file", str(fifo))
    assert code == 2 and report == {}
    assert "a FIFO" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists(os.devnull) or os.name != "posix", reason="needs /dev/null")
def test_a_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"not a regular file \(a character device\)"):
        load_expected_failures(os.devnull)  # today: read as an empty file, silently declaring nothing
    link = tmp_path / "xfails.txt"
    link.symlink_to(os.devnull)  # followed: what would be read is what is judged
    with pytest.raises(UsageError, match="a character device"):
        load_expected_failures(link)
    with pytest.raises(UsageError, match="a directory"):
        load_expected_failures(tmp_path)


def test_a_regular_file_is_still_read(tmp_path: Path) -> None:
    declared = tmp_path / "xfails.txt"
    declared.write_text("engine.stop known\n")
    assert load_expected_failures(declared) == {"engine.stop": "known"}
