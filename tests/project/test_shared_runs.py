"""The tests' shared certify runs (tests/_shared_runs.py): once per session, the same run however spelt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import _shared_runs
from _shared_runs import SharedRuns
from specproof.conformance import Report


def test_a_value_is_computed_once_for_every_worker(tmp_path: Path) -> None:
    calls: list[int] = []

    def compute() -> dict[str, Any]:
        calls.append(1)
        return {"verdict": "pass", "n": len(calls)}

    first, second = SharedRuns(tmp_path), SharedRuns(tmp_path)  # two workers, one session folder
    assert first.once("k", compute) == second.once("k", compute) == {"verdict": "pass", "n": 1}
    assert len(calls) == 1
    assert second.once("other", compute) == {"verdict": "pass", "n": 2}  # another key is another run


def test_options_at_their_defaults_name_the_same_run_and_each_reader_gets_its_own_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[dict[str, Any]] = []

    def fake_certify(subject: str | None = None, **options: Any) -> Report:
        asked.append({"subject": subject, **options})
        return Report.from_json({"verdict": "pass", "results": [{"id": "x", "status": "pass"}]})

    monkeypatch.setattr(_shared_runs, "certify", fake_certify)
    runs = SharedRuns(tmp_path)
    one = runs.certify("drafter", drafter="ngram", only=("drafter.*",))
    two = runs.certify("drafter", drafter="ngram", only=("drafter.*",), seed=None, sampling=None, batches=False)
    assert len(asked) == 1 and one.verdict == two.verdict == "pass"
    one.results[0]["status"] = "changed"
    assert two.results[0]["status"] == "pass"  # no reader sees another's changes
    runs.certify("drafter", drafter="ngram", only=("drafter.*",), profile="ci")
    assert len(asked) == 2  # a different option is a different run


def test_a_run_with_an_example_database_is_not_shared(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not pure"):
        SharedRuns(tmp_path).certify("engine", db=str(tmp_path / "db"))
    with pytest.raises(ValueError, match="not pure"):
        SharedRuns(tmp_path).certify("engine", db="redis://127.0.0.1:1/0")
