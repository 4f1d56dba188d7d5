"""The example database: a failure found once is replayed by every later run that shares it.

The zoo's ``length_cap_hides_eos_in_block`` is found by a seeded quick search (seed 1); the
tests show that a *derandomized* run against the same database replays that failure (the
report's ``database.replayed`` says so, whatever the derandomized search finds by itself),
that namespaces keep subjects and tolerances apart, that bad entries and bad ``--db`` values
are handled before or without a crash, and that the database leaves derandomized generation
as it was.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from specproof.cli import main
from specproof.conformance import certify
from specproof.conformance._database import derandomized_seed, open_database
from specproof.conformance._profiles import get_profile
from specproof.contract import UsageError

MEMBER = "specproof.conformance.zoo:length_cap_hides_eos_in_block"
CONTROL = "specproof.conformance.zoo:zoo_engine"
ONLY = ("engine.stop",)


def _failing(report: dict[str, Any]) -> set[str]:
    return {r["invariant"] for r in report["results"] if r["status"] in ("fail", "error")}


def _entries(db: Path) -> int:
    return sum(1 for p in db.rglob("*") if p.is_file()) if db.exists() else 0


def test_a_seeded_find_is_replayed_by_a_derandomized_run(tmp_path: Path) -> None:
    db = tmp_path / "db"
    found = certify("engine", engine=MEMBER, only=ONLY, seed=1, db=str(db))
    assert _failing(found) == {"engine.stop"}
    assert _entries(db) > 0  # the shrunk failure was saved
    assert found["database"]["replayed"] == {}  # nothing was there to replay
    again = certify("engine", engine=MEMBER, only=ONLY, db=str(db))  # derandomized
    assert _failing(again) == {"engine.stop"}
    assert again["database"]["replayed"] == {"length_cap_hides_eos_in_block-engine.stop": 1}
    result = next(r for r in again["results"] if r["invariant"] == "engine.stop")
    assert result["status"] == "fail" and all(v["invariant"] == "engine.stop" for v in result["violations"])
    # the reproduce line names the database it replays from, and fails again when pasted
    assert f"--db {db}" in result["reproduce"]
    assert main(shlex.split(result["reproduce"])[1:]) == 1


def test_namespaces_keep_subjects_and_tolerances_apart(tmp_path: Path) -> None:
    db = tmp_path / "db"
    certify("engine", engine=MEMBER, only=ONLY, seed=1, db=str(db))
    saved = _entries(db)
    # the correct control, and the member at another tolerance, replay nothing (and delete nothing)
    control = certify("engine", engine=CONTROL, only=ONLY, db=str(db))
    assert control["verdict"] == "pass" and control["database"]["replayed"] == {}
    other = certify("engine", engine=MEMBER, only=ONLY, db=str(db), tie_tolerance=0.5)
    assert other["database"]["replayed"] == {}
    assert _entries(db) == saved
    # another invariant of the same subject has its own namespace too
    lossless = certify("engine", engine=MEMBER, only=("engine.kv-length",), db=str(db))
    assert lossless["database"]["replayed"] == {}
    assert certify("engine", engine=MEMBER, only=ONLY, db=str(db))["database"]["replayed"]


def test_a_corrupted_entry_is_skipped_with_a_warning(tmp_path: Path) -> None:
    db = tmp_path / "db"
    certify("engine", engine=MEMBER, only=ONLY, seed=1, db=str(db))
    files = [p for p in db.rglob("*") if p.is_file()]
    assert files
    for p in files:
        p.write_bytes(b"garbage\xff\xff")  # not a Hypothesis choice sequence
    report = certify("engine", engine=MEMBER, only=ONLY, db=str(db))
    assert report["verdict"] in ("pass", "fail")  # a verdict, not a crash
    assert report["database"]["replayed"] == {}
    assert any("does not decode" in w for w in report["database"]["warnings"]), report["database"]


def test_session_histories_are_kept_and_replayed(tmp_path: Path) -> None:
    db = tmp_path / "db"
    spec = "specproof.conformance.zoo:snapshot_only_last_call"
    first = certify("engine", engine=spec, only=("engine.session",), db=str(db))
    assert _failing(first) == {"engine.session"} and first["database"]["replayed"] == {}
    second = certify("engine", engine=spec, only=("engine.session",), db=str(db))
    assert _failing(second) == {"engine.session"}
    assert second["database"]["replayed"] == {"snapshot_only_last_call-engine.session": 1}
    # a history record that does not load is skipped with a warning; the search still runs
    for p in db.rglob("*"):
        if p.is_file() and p.read_bytes().startswith(b"{"):
            p.write_bytes(b'{"format": "specproof-session/1", "requests": 3}')
    third = certify("engine", engine=spec, only=("engine.session",), db=str(db))
    assert _failing(third) == {"engine.session"}
    assert any("session history" in w for w in third["database"]["warnings"]), third["database"]


def test_no_database_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(tmp_path / "hyp"))
    out = tmp_path / "r.json"
    code = main(
        [
            "certify",
            "engine",
            "--engine",
            MEMBER,
            "--only",
            "engine.stop",
            "--seed",
            "1",
            "--db",
            "none",
            "--report",
            str(out),
        ]
    )
    assert code == 1
    assert json.loads(out.read_text())["database"] is None
    assert _entries(tmp_path / "hyp" / "examples") == 0
    # the default is a directory under the Hypothesis directory
    code = main(["certify", "engine", "--engine", MEMBER, "--only", "engine.stop", "--seed", "1", "--report", str(out)])
    assert code == 1
    assert json.loads(out.read_text())["database"]["local"] == str(tmp_path / "hyp" / "examples")
    assert _entries(tmp_path / "hyp" / "examples") > 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("redis://", "redis://HOST:PORT/N"),
        ("redis://127.0.0.1:notaport/0", "redis://HOST:PORT/N"),
        ("redis://127.0.0.1:1/0", "does not answer"),
        ("/no/such/dir/db", "does not exist"),
    ],
)
def test_bad_db_values_are_usage_errors_before_any_work(
    value: str, message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match=message):
        open_database(value, default_dir=tmp_path)
    code = main(["certify", "engine", "--engine", MEMBER, "--db", value, "--report", str(tmp_path / "r.json")])
    assert code == 2
    assert "--db" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_a_file_is_not_a_database_directory(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        open_database(str(f), default_dir=tmp_path)


def _draws(settings: hypothesis.settings, seed_from_digest: bool) -> list[int]:
    seen: list[int] = []

    @hypothesis.given(st.integers(0, 10**9))
    def draws(x: int) -> None:
        seen.append(x)

    test: Any = draws
    if seed_from_digest:
        test = hypothesis.seed(derandomized_seed(test))(test)
    settings(test)()
    return seen


def test_a_database_keeps_the_derandomized_examples(tmp_path: Path) -> None:
    """With a database, the test is seeded as derandomize=True would be: the same examples, plus reuse."""
    profile = get_profile("quick")
    plain = _draws(profile.hypothesis_settings(seed=None), seed_from_digest=False)
    store = open_database(str(tmp_path / "db"), default_dir=tmp_path)
    assert store is not None
    with_db = _draws(profile.hypothesis_settings(seed=None, database=store.view("k", check="t")), True)
    assert plain == with_db and len(plain) == profile.max_examples
    # (the check can fail: a plain random seed draws other examples)
    other = _draws(profile.hypothesis_settings(seed=1), seed_from_digest=False)
    assert other != plain
