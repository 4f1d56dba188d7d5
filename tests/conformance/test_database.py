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

import attrs
import hypothesis
import pytest
from hypothesis import strategies as st
from hypothesis.database import choices_to_bytes

from specproof.cli import main
from specproof.conformance import Report, certify
from specproof.conformance._database import derandomized_seed, open_database
from specproof.conformance._profiles import get_profile
from specproof.contract import UsageError

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

MEMBER = "specproof.conformance.zoo:length_cap_hides_eos_in_block"
CONTROL = "specproof.conformance.zoo:zoo_engine"
ONLY = ("engine.stop",)


def _failing(report: Report) -> set[str]:
    return {r["invariant"] for r in report.results if r["status"] in ("fail", "error")}


def _database(report: Report) -> dict[str, Any]:
    """The report's ``database`` section (what was replayed, saved and warned about): JSON only."""
    return report.to_json()["database"]


def _entries(db: Path) -> int:
    return sum(1 for p in db.rglob("*") if p.is_file()) if db.exists() else 0


def test_a_seeded_find_is_replayed_by_a_derandomized_run(tmp_path: Path) -> None:
    db = tmp_path / "db"
    found = certify("engine", engine=MEMBER, only=ONLY, seed=1, db=str(db))
    assert _failing(found) == {"engine.stop"}
    assert _entries(db) > 0  # the shrunk failure was saved
    assert _database(found)["replayed"] == {}  # nothing was there to replay
    again = certify("engine", engine=MEMBER, only=ONLY, db=str(db))  # derandomized
    assert _failing(again) == {"engine.stop"}
    assert _database(again)["replayed"] == {"length_cap_hides_eos_in_block-engine.stop": 1}
    # --db-replay failures still replays saved failures (only covering examples are left out)
    failures_only = certify("engine", engine=MEMBER, only=ONLY, db=str(db), db_replay="failures")
    assert _database(failures_only)["replayed"] == {"length_cap_hides_eos_in_block-engine.stop": 1}
    result = next(r for r in again.results if r["invariant"] == "engine.stop")
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
    assert control.verdict == "pass" and _database(control)["replayed"] == {}
    other = certify("engine", engine=MEMBER, only=ONLY, db=str(db), tie_tolerance=0.5)
    assert _database(other)["replayed"] == {}
    assert _entries(db) == saved
    # another invariant of the same subject has its own namespace too
    lossless = certify("engine", engine=MEMBER, only=("engine.kv-length",), db=str(db))
    assert _database(lossless)["replayed"] == {}
    assert _database(certify("engine", engine=MEMBER, only=ONLY, db=str(db)))["replayed"]


def test_a_corrupted_entry_is_skipped_with_a_warning(tmp_path: Path) -> None:
    db = tmp_path / "db"
    certify("engine", engine=MEMBER, only=ONLY, seed=1, db=str(db))
    files = [p for p in db.rglob("*") if p.is_file()]
    assert files
    for p in files:
        p.write_bytes(b"garbage\xff\xff")  # not a Hypothesis choice sequence
    report = certify("engine", engine=MEMBER, only=ONLY, db=str(db))
    assert report.verdict in ("pass", "fail")  # a verdict, not a crash
    assert _database(report)["replayed"] == {}
    assert any("does not decode" in w for w in _database(report)["warnings"]), _database(report)


def test_session_histories_are_kept_and_replayed(tmp_path: Path) -> None:
    db = tmp_path / "db"
    spec = "specproof.conformance.zoo:snapshot_only_last_call"
    first = certify("engine", engine=spec, only=("engine.session",), db=str(db))
    assert _failing(first) == {"engine.session"} and _database(first)["replayed"] == {}
    second = certify("engine", engine=spec, only=("engine.session",), db=str(db))
    assert _failing(second) == {"engine.session"}
    assert _database(second)["replayed"] == {"snapshot_only_last_call-engine.session": 1}
    # a history record that does not load is skipped with a warning; the search still runs
    for p in db.rglob("*"):
        if p.is_file() and p.read_bytes().startswith(b"{"):
            p.write_bytes(b'{"format": "specproof-session/1", "requests": 3}')
    third = certify("engine", engine=spec, only=("engine.session",), db=str(db))
    assert _failing(third) == {"engine.session"}
    assert any("session history" in w for w in _database(third)["warnings"]), _database(third)


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


# ---- covering examples: a rare path a seeded run reached is replayed by derandomized gates ----

CLAMPED = "clamped_at_max_context"
STOP = ("engine.stop",)


def _clamped(report: Report) -> dict[str, int]:
    return {case: row[CLAMPED] for case, row in report.path_coverage.items()}


def test_a_rare_path_a_seeded_run_reached_is_covered_by_the_next_gate(
    tmp_path: Path, seed_reaching_max_context: int
) -> None:
    db = str(tmp_path / "db")
    # without the database the derandomized gate never reaches max_context (the check can fail)
    plain = certify("engine", only=STOP, db="none")
    assert _clamped(plain) == {"checkpoint": 0, "replay": 0}
    seeded = certify("engine", only=STOP, seed=seed_reaching_max_context, db=db)
    assert all(_clamped(seeded).values())
    assert _database(seeded)["covering_saved"].keys() == {"checkpoint", "replay"}
    gate = certify("engine", only=STOP, db=db)  # derandomized, sharing the database
    assert gate.verdict == "pass" and all(_clamped(gate).values())
    db_info = _database(gate)
    assert db_info["covering_paths"] == {"checkpoint": [CLAMPED], "replay": [CLAMPED]}
    # only the unreached path's example is replayed: one per case, on top of the gate's own examples
    assert db_info["covering_replayed"] == {"checkpoint": 1, "replay": 1}
    for case, row in gate.path_coverage.items():
        own = plain.path_coverage[case]
        assert row["generations"] == own["generations"] + 1
        # the gate's own examples are the ones it draws without the database (kept, not displaced)
        assert all(row[p] >= n for p, n in own.items())
    # nothing is saved by a derandomized run, and the covering examples stay for the next gate
    assert db_info["covering_saved"] == {}
    assert _database(certify("engine", only=STOP, db=db))["covering_replayed"] == {"checkpoint": 1, "replay": 1}


def test_db_replay_failures_leaves_the_covering_examples_unreplayed(
    tmp_path: Path, seed_reaching_max_context: int
) -> None:
    """``--db-replay failures``: the gate's examples and cost are its own, whatever campaigns saved;
    the covering examples stay in the database for a gate that replays all."""
    db = str(tmp_path / "db")
    certify("engine", only=STOP, seed=seed_reaching_max_context, db=db)
    own = certify("engine", only=STOP, db=db, db_replay="failures")
    assert _database(own)["replay"] == "failures" and _database(own)["covering_replayed"] == {}
    assert own.path_coverage == certify("engine", only=STOP, db="none").path_coverage
    everything = certify("engine", only=STOP, db=db)
    assert _database(everything)["replay"] == "all"
    assert _database(everything)["covering_replayed"] == {"checkpoint": 1, "replay": 1}
    with pytest.raises(UsageError, match="--db-replay 'some'"):
        certify("engine", only=STOP, db=db, db_replay="some")


def test_a_gate_reaching_every_path_replays_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "db")
    certify("engine", engine=CONTROL, only=STOP, seed=1, db=db)
    gate = certify("engine", engine=CONTROL, only=STOP, db=db)
    assert _database(gate)["covering_replayed"] == {}
    assert gate.path_coverage == certify("engine", engine=CONTROL, only=STOP, db="none").path_coverage


def test_a_path_keeps_one_covering_example_the_smallest(tmp_path: Path) -> None:
    store = open_database(str(tmp_path / "db"), default_dir=tmp_path)
    assert store is not None
    view = store.view("k", check="t")
    small, large = choices_to_bytes((1, 2)), choices_to_bytes((5, 6, 7))
    assert view.keep_covering("partial", large)
    assert view.keep_covering("partial", small)  # smaller: replaces the saved one
    assert not view.keep_covering("partial", large)
    assert view.covering(["partial"]) == [small]
    assert view.keep_covering("rejected_at_0", small)
    assert view.covering(["partial", "rejected_at_0", "empty_draft"]) == [small]  # each example once


def test_a_covering_example_that_fails_is_shrunk_and_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed_reaching_max_context: int
) -> None:
    """An engine that goes wrong only at max_context: the gate finds it through the covering example."""
    from specproof.conformance import _registry as registry
    from specproof.conformance._registry import Outcome

    db = str(tmp_path / "db")
    certify("engine", only=STOP, seed=seed_reaching_max_context, db=db)  # the correct engine: covering saved
    real = registry.by_subject

    def broken_at_max_context(subject: Any) -> tuple[Any, ...]:
        out = []
        for inv in real(subject):
            if inv.id == "engine.stop":

                def check_clamped(new: Any, case: Any, run: Any, old: Any = inv) -> Any:
                    if run.paths[CLAMPED]:
                        return Outcome(violations=[new.violation("a round at max_context went wrong")])
                    return old.check(case, run)

                inv = attrs.evolve(inv, on_record=None, check=check_clamped)
            out.append(inv)
        return tuple(out)

    monkeypatch.setattr(registry, "by_subject", broken_at_max_context)
    assert certify("engine", only=STOP, db="none").verdict == "pass"  # the gate alone misses it
    gate = certify("engine", only=STOP, db=db)
    assert _failing(gate) == {"engine.stop"}
    for r in gate.results:
        assert [v["explanation"] for v in r["violations"]] == ["a round at max_context went wrong"]
    # shrunk from the covering example and saved as a failure: the next gate replays it as one
    again = certify("engine", only=STOP, db=db)
    assert _database(again)["replayed"] == {"checkpoint-engine.stop": 1, "replay-engine.stop": 1}
