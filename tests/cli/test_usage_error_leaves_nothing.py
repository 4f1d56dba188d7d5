"""A usage error leaves nothing behind (issue 35, faults): every option is checked before anything
is created, so no empty ``hyp/``, ``sessions/`` or ``examples/`` folder is left by a run that did
not start. The checks that a directory can be written leave nothing either (``probe_directory``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specproof.cli import main
from specproof.conformance._database import probe_directory


@pytest.mark.parametrize(
    "extra",
    [
        ["--profile", "nope"],
        ["--only", "no.such-invariant"],
        ["--drafter", "no_such_module:make"],
        ["--sampling", "temperature=-1"],
        ["--expect-fail", "no.such-invariant"],
        ["--replay-session", "missing.json"],
        ["--max-context", "1"],
    ],
)
@pytest.mark.parametrize("where", ["option", "environment"])
def test_a_usage_error_creates_no_folder(
    extra: list[str], where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "cache" / "hyp"
    (tmp_path / "cache").mkdir()
    monkeypatch.chdir(tmp_path)
    if where == "option":
        args = ["certify", *extra, "--hypothesis-dir", str(home)]
    else:
        monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(home))
        args = ["certify", *extra]
    assert main(args) == 2, capsys.readouterr()
    assert "Traceback" not in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cache"]


def test_a_usage_error_leaves_no_examples_folder_in_a_db_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["certify", "--profile", "nope", "--db", str(tmp_path / "db"), "--hypothesis-dir", str(tmp_path / "hyp")]
    assert main(args) == 2
    assert list(tmp_path.iterdir()) == []


def test_probing_a_directory_leaves_nothing_and_refuses_what_cannot_hold_one(tmp_path: Path) -> None:
    probe_directory(tmp_path / "a" / "b" / "c")  # not there yet: probed in its nearest existing ancestor
    probe_directory(tmp_path)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        probe_directory(tmp_path / "file" / "sub")
    with pytest.raises(OSError):
        probe_directory(tmp_path / "file")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]
