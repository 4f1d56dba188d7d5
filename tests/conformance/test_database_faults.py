"""The example database never loses a find in silence (issue 27, docs/fuzzing.md).

Hypothesis' ``DirectoryBasedExampleDatabase.save`` swallows ``OSError``: a full disk, a
read-only file system or a file where a key directory should be kept nothing and the report
said nothing. These tests run as whatever user the suite runs as (root ignores permission
bits), so the faults are made without them: a file where a directory should be, a monkeypatched
``mkstemp`` raising ENOSPC, an ``os.write`` that writes nothing (the empty entries of a full
disk), a path under ``/proc``. Each one is recorded in ``database.unsaved`` naming the path and
makes the verdict FAIL; a writable database still saves and replays.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main
from specproof.conformance import certify
from specproof.conformance._database import ExampleStore, open_database
from specproof.contract import UsageError

MEMBER = "specproof.conformance.zoo:length_cap_hides_eos_in_block"
CONTROL = "specproof.conformance.zoo:zoo_engine"
ONLY = ("engine.stop",)
VALUE = bytes([0, 1, 2, 3])  # what is saved: the store does not decode on save


def _store(tmp_path: Path) -> ExampleStore:
    store = open_database(str(tmp_path / "db"), default_dir=tmp_path / "unused")
    assert store is not None
    return store


def _entry(store: ExampleStore, value: bytes = VALUE) -> Path:
    """Save ``value`` under a check's namespace and return the file it was kept in."""
    assert store.local is not None
    before = {p for p in store.local.rglob("*") if p.is_file()}
    store.view("k" * 32, check="demo").save(b"key", value)
    new = [p for p in store.local.rglob("*") if p.is_file() and p not in before and p.read_bytes() == value]
    assert len(new) == 1, new
    return new[0]


def _enospc(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_writable_database_saves_and_replays_and_says_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _entry(store)
    assert list(store.view("k" * 32, check="demo").fetch(b"key")) == [VALUE]
    assert store.unsaved == [] and store.warnings == []
    assert store.describe()["unsaved"] == []


def test_a_file_where_a_key_directory_should_be_is_a_save_not_kept(tmp_path: Path) -> None:
    store = _store(tmp_path)
    key_dir = _entry(store).parent
    for p in key_dir.iterdir():
        p.unlink()
    key_dir.rmdir()
    key_dir.write_bytes(b"in the way")  # a file where the key directory should be
    store.view("k" * 32, check="demo").save(b"key", b"another find")
    assert len(store.unsaved) == 1 and str(key_dir) in store.unsaved[0], store.unsaved
    assert store.describe()["unsaved"] == store.unsaved


def test_a_full_disk_is_a_save_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path)
    monkeypatch.setattr(tempfile, "mkstemp", _enospc)  # Hypothesis writes through mkstemp
    store.view("k" * 32, check="demo").save(b"key", VALUE)
    assert store.unsaved and all(str(tmp_path / "db") in u for u in store.unsaved), store.unsaved


def test_a_short_write_leaves_no_empty_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk shows as files written short (empty entries): read back, removed, recorded."""
    store = _store(tmp_path)
    assert store.local is not None
    with monkeypatch.context() as m:
        m.setattr(os, "write", lambda fd, data: 0)  # nothing written, no error raised
        store.view("k" * 32, check="demo").save(b"key", VALUE)
    assert store.unsaved and "does not hold the example" in store.unsaved[0], store.unsaved
    assert not [p for p in store.local.rglob("*") if p.is_file() and p.stat().st_size == 0]


def test_a_save_not_kept_fails_the_verdict_and_the_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db"
    db.mkdir()
    real = tempfile.mkstemp

    def mkstemp(*args: Any, **kwargs: Any) -> Any:  # the disk fills after --db was checked
        if kwargs.get("dir") is None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    report = certify("engine", engine=MEMBER, only=ONLY, seed=1, db=str(db)).to_json()
    assert report["verdict"] == "fail"
    assert report["database"]["unsaved"] and str(db) in report["database"]["unsaved"][0]
    assert "did not keep" in report["verdict_reason"] and str(db) in report["verdict_reason"]
    code = main(["certify", "engine", "--engine", MEMBER, "--only", *ONLY, "--seed", "1", "--db", str(db)])
    assert code == 1
    capsys.readouterr()


def test_a_covering_example_not_kept_fails_a_run_that_otherwise_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A correct engine's seeded run saves covering examples; a full disk turns its PASS into FAIL."""
    db = tmp_path / "db"
    args = ["certify", "engine", "--engine", CONTROL, "--seed", "1", "--db", str(db)]
    assert main([*args, "--report", str(tmp_path / "ok.json")]) == 0  # the control: it passes and saves
    assert json.loads((tmp_path / "ok.json").read_text())["database"]["covering_saved"]
    shutil.rmtree(db)
    db.mkdir()
    real = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: real(*a, **k) if k.get("dir") else _enospc())
    assert main([*args, "--report", str(tmp_path / "lost.json")]) == 1
    report = json.loads((tmp_path / "lost.json").read_text())
    assert not [r for r in report["results"] if r["status"] in ("fail", "error")]  # every check passed
    assert report["verdict"] == "fail" and str(db) in report["verdict_reason"], report["verdict_reason"]
    assert report["database"]["unsaved"]
    capsys.readouterr()


def test_a_save_not_kept_fails_a_run_that_otherwise_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict computation itself: a PASS with an unkept save is FAIL naming the path."""
    from specproof.conformance import reports

    store = _store(tmp_path)
    store.not_kept(f"the example database did not keep an example: {tmp_path / 'db' / 'x'}: ENOSPC")
    cert: Any = type("C", (), {"plan": type("P", (), {"database": store})()})()
    monkeypatch.setattr(reports, "_verdict_of_results", lambda cert, results: ("pass", ""))
    verdict, why = reports._verdict(cert, [])
    assert verdict == "fail" and str(tmp_path / "db" / "x") in why
    monkeypatch.setattr(reports, "_verdict_of_results", lambda cert, results: ("inconclusive", "nothing ran"))
    assert reports._verdict(cert, [])[0] == "fail"
    store.unsaved.clear()  # the control: nothing lost, the verdict is the results'
    assert reports._verdict(cert, []) == ("inconclusive", "nothing ran")


def test_a_fifo_entry_is_skipped_before_any_read(tmp_path: Path) -> None:
    store = _store(tmp_path)
    key_dir = _entry(store).parent
    fifo = key_dir / "fifo"
    os.mkfifo(fifo)
    got: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: got.append(list(store.view("k" * 32, check="demo").fetch(b"key"))))
    reader.daemon = True  # (today's code blocks in open() on the FIFO: the thread never ends)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "fetch hung on a FIFO entry"
    assert got == [[VALUE]]
    assert any("not a regular file" in w and str(fifo) in w for w in store.warnings), store.warnings


def test_a_symlink_to_dev_zero_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path)
    key_dir = _entry(store).parent
    link = key_dir / "zero"
    link.symlink_to("/dev/zero")
    read = pathlib.Path.read_bytes

    def guarded(self: Path) -> bytes:  # today's code reads /dev/zero until memory runs out
        if os.path.realpath(self) == "/dev/zero":
            raise AssertionError(f"read {self}")
        return read(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", guarded)
    assert list(store.view("k" * 32, check="demo").fetch(b"key")) == [VALUE]
    assert any("not a regular file" in w and str(link) in w for w in store.warnings), store.warnings


@pytest.mark.parametrize(
    ("value", "message"), [("", "empty"), ("  ", "empty"), ("/proc/specproof-db", "cannot be written")]
)
def test_an_empty_or_unwritable_db_is_a_usage_error(
    value: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=message):
        open_database(value, default_dir=tmp_path / "default")
    code = main(["certify", "engine", "--engine", MEMBER, "--db", value, "--report", str(tmp_path / "r.json")])
    assert code == 2
    assert "--db" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists() and list(tmp_path.iterdir()) == []  # nothing written in the cwd


def test_the_plugins_empty_db_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # pytest in-process, as certify runs it: only the option check is exercised
    pyargs = ["-p", "no:cacheprovider", "-q", "--capture=no", "--pyargs", "specproof.conformance"]
    code = pytest.main([*pyargs, "--specproof-db", "", "--specproof-report", str(tmp_path / "r.json")])
    out = capsys.readouterr()
    assert code == pytest.ExitCode.USAGE_ERROR, out.out + out.err
    assert "--specproof-db '': empty" in out.err
    assert not (tmp_path / "r.json").exists() and "passed" not in out.out


def test_a_campaign_whose_workers_did_not_keep_a_find_fails_naming_the_path(tmp_path: Path) -> None:
    from specproof.conformance._campaign import CampaignOptions, CampaignState, WorkerState

    def state(unsaved: list[str]) -> CampaignState:
        s = CampaignState(CampaignOptions(plan={}, db=str(tmp_path / "db"), hypothesis_dir=str(tmp_path / "h")))
        s.workers = [WorkerState(0, rounds=1), WorkerState(1, rounds=1)]  # (a campaign of no round is inconclusive)
        s.checks = {"x": {"id": "x", "status": "pass", "examples": 1, "exercised": 1}}
        base: dict[str, Any] = {"replayed": {}, "warnings": [], "lost": None}
        s.databases = {0: {**base, "unsaved": unsaved}, 1: {**base, "unsaved": []}}
        return s

    kept = state([]).report()  # the control: every save kept, every check passed
    assert kept["verdict"] == "pass" and kept["database"]["unsaved"] == []
    path = str(tmp_path / "db" / "abc" / "def")
    lost = state([f"the example database did not keep an example: {path}: ENOSPC"]).report()
    assert lost["verdict"] == "fail" and path in lost["verdict_reason"]
    assert lost["database"]["unsaved"] == [f"the example database did not keep an example: {path}: ENOSPC"]


# ---- issue 27, second review: the default database probed up front, kept saves counted, real errors named


def _refuse_under(root: Path, err: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files cannot be made under ``root`` (as a read-only mount refuses them; root ignores mode
    bits, so the fault is made here): ``mkstemp`` and ``mkdir`` there raise ``err``."""
    real_mkstemp, real_mkdir = tempfile.mkstemp, pathlib.Path.mkdir

    def under(path: object) -> bool:
        return path is not None and (Path(str(path)) == root or root in Path(str(path)).parents)

    def mkstemp(*args: Any, **kwargs: Any) -> Any:
        if under(kwargs.get("dir")):
            raise OSError(err, os.strerror(err))
        return real_mkstemp(*args, **kwargs)

    def mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        if under(self) and not self.is_dir():
            raise OSError(err, os.strerror(err), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)


def test_an_unwritable_default_database_is_a_usage_error_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "hyp"
    (home / "examples").mkdir(parents=True)
    assert open_database(None, default_dir=home / "examples") is not None  # the control: writable
    _refuse_under(home / "examples", errno.EROFS, monkeypatch)
    with pytest.raises(UsageError, match=r"example database .*examples.* cannot be written \(EROFS"):
        open_database(None, default_dir=home / "examples")
    blocked = tmp_path / "file"
    blocked.write_text("in the way")  # a file where the default directory's parent should be
    with pytest.raises(UsageError, match=r"cannot be written \(ENOTDIR"):
        open_database(None, default_dir=blocked / "examples")


@pytest.mark.parametrize("verb", ["certify", "fuzz"])
def test_certify_and_fuzz_refuse_an_unwritable_default_database(
    verb: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "hyp"
    (home / "examples").mkdir(parents=True)
    _refuse_under(home / "examples", errno.EROFS, monkeypatch)
    timing = ["--for", "10", "--workers", "1"] if verb == "fuzz" else []
    report = tmp_path / "r.json"
    argv = [verb, "engine", "--engine", CONTROL, "--only", *ONLY, *timing, "--hypothesis-dir", str(home)]
    assert main([*argv, "--report", str(report)]) == 2
    err = capsys.readouterr().err
    assert str(home / "examples") in err and "Read-only file system" in err, err
    assert not report.exists()  # nothing ran


@pytest.mark.parametrize("verb", ["certify", "fuzz"])
def test_an_unwritable_session_history_directory_is_a_usage_error(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "hyp"
    home.mkdir()
    (home / "sessions").write_text("in the way")  # a file where the session histories go
    timing = ["--for", "10", "--workers", "1"] if verb == "fuzz" else []
    report = tmp_path / "r.json"
    argv = [verb, "engine", "--engine", CONTROL, "--only", *ONLY, *timing, "--hypothesis-dir", str(home)]
    assert main([*argv, "--report", str(report)]) == 2
    err = capsys.readouterr().err
    assert str(home / "sessions") in err and "cannot be written" in err, err
    assert not report.exists()


def test_a_covering_example_not_kept_is_not_counted_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path)
    view: Any = store.view("k" * 32, check="demo")
    assert view.keep_covering("rollback", VALUE) is True  # the control: kept, and read back
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: _enospc() if k.get("dir") is None else None)
    assert view.keep_covering("rollback", VALUE[:2]) is False  # smaller, so saved: but not kept
    assert store.unsaved and store.failed_saves == 1


def test_the_console_does_not_count_covering_examples_that_were_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db"
    real = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: real(*a, **k) if k.get("dir") else _enospc())
    args = ["certify", "engine", "--engine", CONTROL, "--seed", "1", "--db", str(db)]
    assert main([*args, "--report", str(tmp_path / "lost.json")]) == 1
    report = json.loads((tmp_path / "lost.json").read_text())
    assert report["database"]["unsaved"] and report["database"]["covering_saved"] == {}, report["database"]
    out = capsys.readouterr().out
    assert "covering example(s) (new or smaller" not in out, out


@pytest.mark.parametrize(
    ("fault", "named"),
    [("read-only", "EROFS: Read-only file system"), ("full temporary directory", "ENOSPC: No space left on device")],
)
def test_a_save_not_kept_names_the_error_that_stopped_it(
    fault: str, named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path)
    if fault == "read-only":
        _refuse_under(tmp_path / "db", errno.EROFS, monkeypatch)
    else:
        monkeypatch.setattr(tempfile, "mkstemp", _enospc)
    store.view("k" * 32, check="demo").save(b"key", VALUE)
    assert store.unsaved, store.unsaved
    assert all(named in u for u in store.unsaved), store.unsaved
    assert not any("FileNotFoundError" in u for u in store.unsaved), store.unsaved  # (the read-back's error)
