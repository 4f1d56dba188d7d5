"""Session histories live in the example database: saved in the check's namespace (read back like
every save), replayed from it, republished to a shared database when found only locally; the one
file a failing session leaves (what ``--replay-session`` replays) goes under the Hypothesis
directory the user named, never beside it, and nothing lands in the working directory.

The subject is the zoo's ``snapshot_only_last_call`` (its session cache restores the wrong
snapshot on a prefix hit), which ``engine.session`` fails within a second at quick.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main
from specproof.conformance import certify

pytestmark = pytest.mark.slow  # real certify runs: outside `tox -e quick`, always in `tox`

SPEC = "specproof.conformance.zoo:snapshot_only_last_call"
CHECK = "snapshot_only_last_call-engine.session"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_a_failing_sessions_files_stay_under_the_named_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--hypothesis-dir A/hyp --db B/db``, run from C: the history file is under A/hyp, the history
    record in B/db; nothing in A beside A/hyp, nothing in C; the reproduce line, pasted, fails again."""
    named, db, cwd = tmp_path / "a", tmp_path / "b" / "db", tmp_path / "c"
    hyp = named / "hyp"
    for d in (named, db.parent, cwd):
        d.mkdir()
    monkeypatch.chdir(cwd)
    report = tmp_path / "r.json"
    args = ["certify", "engine", "--engine", SPEC, "--only", "engine.session", "--hypothesis-dir", str(hyp)]
    assert main([*args, "--db", str(db), "--report", str(report)]) == 1
    written = _files(named)
    assert written and all(p.is_relative_to(hyp) for p in written), written
    assert _files(cwd) == [] and not any(cwd.iterdir()), list(cwd.iterdir())
    result = next(r for r in json.loads(report.read_text())["results"] if r["id"] == CHECK)
    reproduce = shlex.split(result["reproduce"])
    history = Path(reproduce[reproduce.index("--replay-session") + 1])
    assert history.is_relative_to(hyp / "sessions") and history.is_file(), history
    # the history is kept in the database too: the same record, in the check's namespace
    saved = [p for p in _files(db) if p.read_bytes().startswith(b"{")]
    assert [json.loads(p.read_bytes()) for p in saved] == [json.loads(history.read_text())]
    # the printed line, pasted, fails again (and still writes nothing beside the named directories)
    assert main(reproduce[1:]) == 1
    assert all(p.is_relative_to(hyp) for p in _files(named)) and not any(cwd.iterdir())


def _keys(url: str) -> list[Any]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return list(client.keys("*"))
    finally:
        client.close()


def _flush(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


def _database(report: Any) -> dict[str, Any]:
    return report.to_json()["database"]  # type: ignore[no-any-return]


def test_a_history_found_only_locally_is_republished_to_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server: Any
) -> None:
    """Machine 1 finds the failure (history saved locally and in Redis); Redis loses it (flushed);
    machine 1's next run replays it from its local copy and publishes it again; machine 2, with an
    empty local directory, then replays it from Redis."""
    url = redis_server.url
    monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(tmp_path / "machine1"))
    first = certify("engine", engine=SPEC, only=("engine.session",), db=url)
    assert first.verdict == "fail" and _keys(url), "the failure and its history reach Redis"
    _flush(url)
    again = certify("engine", engine=SPEC, only=("engine.session",), db=url)
    assert _database(again)["replayed"] == {CHECK: 1}  # from the local copy
    monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(tmp_path / "machine2"))
    other = certify("engine", engine=SPEC, only=("engine.session",), db=url)
    assert _database(other)["replayed"] == {CHECK: 1}, _database(other)  # from Redis: machine 2 has no copy
    # machine 2 keeps its own copy now: a server that goes away later loses nothing
    assert any(p.read_bytes().startswith(b"{") for p in _files(tmp_path / "machine2" / "examples"))
    # the report says which run published it again
    assert _database(again).get("republished") == {CHECK: 1} and _database(other).get("republished") == {}
