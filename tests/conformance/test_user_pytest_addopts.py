"""``specproof certify`` inside a user's CI, where ``PYTEST_ADDOPTS`` carries options for their own suite: the
in-process certifying run must not read them (an xdist ``-n`` is an unknown option there since it runs without
xdist; a ``-x`` would end the certification at its first failing check)."""

from __future__ import annotations

import json
import os

import pytest

from specproof import cli


@pytest.mark.parametrize("addopts", ["-n 2", "-x --maxfail=1"])
def test_certify_ignores_the_users_pytest_addopts(
    addopts: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", addopts)
    capsys.readouterr()
    code = cli.main(["certify", "target", "--profile", "quick", "--only", "target.shape", "--db", "none", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report.get("verdict_reason")
    assert report["verdict"] == "pass"
    assert [r["id"] for r in report["results"]] == ["target.shape"]
    assert os.environ["PYTEST_ADDOPTS"] == addopts  # given back to the user's process
