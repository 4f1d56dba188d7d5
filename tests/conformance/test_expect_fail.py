"""Declared expected failures: ``certify --expect-fail ID[=reason]`` and ``--expect-fail-file``.

A known, documented failure is reported as ``xfail`` and does not fail the verdict; a declared
failure that passes is ``xpass`` and fails it (strict, as pytest's ``xfail(strict=True)``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specproof.cli import main
from specproof.conformance import certify
from specproof.conformance._expected import load_expected_failures, parse_expected_failures
from specproof.contract import UsageError

BROKEN = "specproof.conformance.zoo:too_long"  # fails drafter.max-length
CONTROL = "specproof.conformance.zoo:lookup_drafter"  # passes it


# drafter.token-range passes on both: a run of declared failures alone is no PASS (a subject needs a pass)
ONLY = "drafter.max-length,drafter.token-range"


def _run(tmp_path: Path, spec: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    code = main(["certify", "drafter", "--drafter", spec, "--only", ONLY, "--report", str(out), *extra])
    return code, json.loads(out.read_text()) if out.exists() else {}


def _max_length(report: dict) -> dict:
    (result,) = [r for r in report["results"] if r["invariant"] == "drafter.max-length"]
    return result


def test_a_declared_failure_is_xfail_and_does_not_fail_the_gate(tmp_path: Path) -> None:
    code, report = _run(tmp_path, BROKEN, "--expect-fail", "drafter.max-length=drafts k+1, issue #4")
    assert code == 0 and report["verdict"] == "pass", report["results"]
    result = _max_length(report)
    assert result["status"] == "xfail" and result["violations"]  # still ran, still found it
    assert result["expected_failure"] == "drafts k+1, issue #4"
    assert report["expected_failures"] == [{"invariant": "drafter.max-length", "reason": "drafts k+1, issue #4"}]


def test_without_the_declaration_the_same_failure_fails(tmp_path: Path) -> None:
    code, report = _run(tmp_path, BROKEN)
    assert code == 1 and report["verdict"] == "fail"
    assert _max_length(report)["status"] == "fail" and report["expected_failures"] == []


def test_a_declared_failure_that_passes_is_xpass_and_fails_the_gate(tmp_path: Path) -> None:
    code, report = _run(tmp_path, CONTROL, "--expect-fail", "drafter.max-length")
    assert code == 1 and report["verdict"] == "fail"
    result = _max_length(report)
    assert result["status"] == "xpass" and "remove the declaration" in result["detail"]
    assert "drafter.max-length" in report["verdict_reason"]


def test_the_file_form(tmp_path: Path) -> None:
    declared = tmp_path / "xfails.txt"
    declared.write_text("# known failures of this drafter\n\ndrafter.max-length drafts one token too many  \n")
    code, report = _run(tmp_path, BROKEN, "--expect-fail-file", str(declared))
    assert code == 0 and _max_length(report)["status"] == "xfail"
    assert report["expected_failures"] == [{"invariant": "drafter.max-length", "reason": "drafts one token too many"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("drafter.max-length\nengine.lossles too close\n", r"xfails.txt:2: 'engine.lossles' is not an invariant id"),
        ("# header\nnot-an-id\n", r"xfails.txt:2: 'not-an-id' is not an invariant id"),
    ],
)
def test_a_bad_file_line_is_a_usage_error_naming_the_line(tmp_path: Path, text: str, message: str) -> None:
    declared = tmp_path / "xfails.txt"
    declared.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_expected_failures(declared)
    out = tmp_path / "report.json"
    code = main(["certify", "drafter", "--expect-fail-file", str(declared), "--report", str(out)])
    assert code == 2 and not out.exists()  # nothing ran, nothing written


def test_option_parsing() -> None:
    assert parse_expected_failures(["engine.cost", "engine.stop=flaky stop reason"]) == {
        "engine.cost": "declared expected failure",
        "engine.stop": "flaky stop reason",
    }
    with pytest.raises(UsageError, match=r"'engine.costs' is not an invariant id.*did you mean engine.cost"):
        parse_expected_failures(["engine.costs"])
    with pytest.raises(UsageError, match="give an invariant id"):
        parse_expected_failures(["=why"])
    with pytest.raises(UsageError, match="cannot read it"):
        load_expected_failures("/nonexistent/xfails.txt")


def test_the_python_api_takes_them_too() -> None:
    report = certify(
        "drafter", drafter=BROKEN, only=tuple(ONLY.split(",")), expected_failures={"drafter.max-length": "known"}
    )
    assert report.verdict == "pass" and _max_length(report.to_json())["status"] == "xfail"


def test_an_oversized_expect_fail_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from specproof.contract.files import MAX_USER_FILE_BYTES

    big = tmp_path / "xfails.txt"
    with big.open("wb") as f:
        f.truncate(MAX_USER_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(UsageError, match=r"cannot read it: .*more than the limit"):
        load_expected_failures(big)
