"""A baseline consistent with itself (issue 35: an acceptance baseline claiming more accepted tokens than
attempts was accepted). Each inconsistency is refused with the field named, by ``load_baseline`` and by
``specproof bench --gate`` before anything is measured; a consistent baseline, including one whose rates
rise with the draft position (only the counts cannot), is accepted."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from _bench_records import result as speed_result
from specproof.bench import BaselineError, load_baseline, make_baseline
from specproof.cli import main


def _teacher_forced(name: str, rounds: int, attempts: list[int], accepts: list[int]) -> dict[str, Any]:
    emitted = rounds + sum(accepts)  # teacher-forced: every round emits its accepted tokens and one more
    return {
        "workload": name,
        "kind": "teacher-forced",
        "rounds": rounds,
        "emitted": emitted,
        "tokens_per_round": emitted / rounds,
        "attempts_by_position": attempts,
        "accepts_by_position": accepts,
        "acceptance_by_position": [a / n for a, n in zip(accepts, attempts)],
    }


def _record() -> dict[str, Any]:
    """An acceptance record written by hand (k = 3): real contexts pooled over two texts, one workload."""
    texts = [_teacher_forced("a.py", 10, [10, 6, 3], [6, 3, 1]), _teacher_forced("b.py", 10, [10, 5, 2], [5, 2, 0])]
    pooled = _teacher_forced("real-contexts", 20, [20, 11, 5], [11, 5, 1])
    pooled["texts"] = texts
    free = {  # free-running: the last round of a chunk may be cut, so emitted <= rounds + accepted
        "workload": "code-edit",
        "kind": "free-running",
        "rounds": 12,
        "emitted": 27,
        "tokens_per_round": 27 / 12,
        "attempts_by_position": [12, 11, 10],
        "accepts_by_position": [8, 5, 3],
        "acceptance_by_position": [8 / 12, 5 / 11, 3 / 10],
        "lossless": True,
        "rollback": "checkpoint",
    }
    return {"drafter": "ngram", "target": "trained", "k": 3, "greedy": True, "workloads": [pooled, free]}


def _baseline(record: dict[str, Any] | None = None) -> dict[str, Any]:
    result = {"version": "0.1.0", "platform": {}, "config": {"mode": "quick", "target": "trained"}}
    return make_baseline({**result, "acceptance": record or _record()})


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(doc))
    return path


def test_consistent_baselines_are_accepted(tmp_path: Path) -> None:
    assert load_baseline(_write(tmp_path, _baseline()))["acceptance"]["k"] == 3
    # correct but different: rates that rise with the position (a drafter surer of its later tokens)
    record = _record()
    free = record["workloads"][1]
    free.update(attempts_by_position=[12, 6, 3], accepts_by_position=[6, 5, 3], acceptance_by_position=[0.5, 5 / 6, 1])
    free.update(emitted=26, tokens_per_round=26 / 12)
    assert load_baseline(_write(tmp_path, _baseline(record)))["acceptance"]["workloads"][1]["emitted"] == 26
    assert load_baseline(Path(__file__).resolve().parents[2] / "benchmarks" / "baseline.json")["figures"]


W1 = "acceptance.workloads[1]"
T0 = "acceptance.workloads[0].texts[0]"

ACCEPTANCE_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "more-accepts-than-attempts",
        lambda r: r["workloads"][1]["accepts_by_position"].__setitem__(0, 13),
        f"field '{W1}.accepts_by_position[0]' is 13: more accepted tokens than the 12 attempts at draft "
        f"position 1 ({W1}.attempts_by_position[0])",
    ),
    (
        "more-accepts-than-attempts-in-a-text",
        lambda r: r["workloads"][0]["texts"][0]["accepts_by_position"].__setitem__(2, 4),
        f"field '{T0}.accepts_by_position[2]' is 4: more accepted tokens than the 3 attempts at draft "
        f"position 3 ({T0}.attempts_by_position[2])",
    ),
    (
        "rate-not-its-counts",
        lambda r: r["workloads"][1]["acceptance_by_position"].__setitem__(2, 0.5),
        f"field '{W1}.acceptance_by_position[2]' is 0.5, but 3 accepted of 10 attempts is 0.3",
    ),
    (
        "attempts-rising",
        lambda r: r["workloads"][1].update(
            attempts_by_position=[12, 10, 11], acceptance_by_position=[8 / 12, 0.5, 3 / 11]
        ),
        f"field '{W1}.attempts_by_position[2]' is 11, more than the 10 at draft position 2 (a draft that reaches "
        "a position reached every one before it)",
    ),
    (
        "accepts-rising",
        lambda r: r["workloads"][1].update(accepts_by_position=[8, 5, 6], acceptance_by_position=[8 / 12, 5 / 11, 0.6]),
        f"field '{W1}.accepts_by_position[2]' is 6, more than the 5 at draft position 2 (a round accepts a prefix "
        "of its draft)",
    ),
    (
        "more-attempts-than-rounds",
        lambda r: r["workloads"][1].update(rounds=11, tokens_per_round=27 / 11),
        f"field '{W1}.attempts_by_position[0]' is 12: more attempts than the 11 rounds",
    ),
    (
        "emitted-beyond-the-accepted",
        lambda r: r["workloads"][1].update(emitted=40, tokens_per_round=40 / 12),
        f"field '{W1}.emitted' is 40, but 12 rounds emit one token each plus their 16 accepted tokens at most: "
        "between 12 and 28",
    ),
    (
        "tokens-per-round-not-its-counts",
        lambda r: r["workloads"][1].update(tokens_per_round=3.0),
        f"field '{W1}.tokens_per_round' is 3.0, but 27 tokens in 12 rounds is 2.25",
    ),
    (
        "positions-not-k",
        lambda r: r.update(k=4),
        "field 'acceptance.workloads[0].attempts_by_position' has 3 positions, but the baseline's draft length k is 4",
    ),
    (
        "pooled-not-the-sum-of-its-texts",
        lambda r: (
            r["workloads"][0]["texts"][1].update(
                rounds=11, emitted=18, tokens_per_round=18 / 11, attempts_by_position=[11, 5, 2]
            )
            or r["workloads"][0]["texts"][1].update(acceptance_by_position=[5 / 11, 2 / 5, 0.0])
        ),
        "field 'acceptance.workloads[0].rounds' is 20, but its texts' add up to 21",
    ),
]


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in ACCEPTANCE_CASES], ids=[c[0] for c in ACCEPTANCE_CASES])
def test_inconsistent_acceptance_counts_are_refused_naming_the_field(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = _baseline()
    edit(doc["acceptance"])  # the counts alone: the figures were made from the consistent record
    path = _write(tmp_path, doc)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert str(info.value) == f"baseline {path}: {message}"


def test_figures_that_are_not_what_the_counts_give_are_refused(tmp_path: Path) -> None:
    doc = _baseline()
    doc["figures"]["acceptance/code-edit/position_1"]["value"] = 0.75  # the counts give 8 / 12
    path = _write(tmp_path, doc)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert str(info.value) == (
        f"baseline {path}: field 'figures.acceptance/code-edit/position_1.value' is 0.75, but the acceptance "
        f"counts give {8 / 12!r}"
    )
    doc = _baseline()
    doc["figures"]["acceptance/free-text/tokens_per_round"] = {"value": 2.0, "kind": "acceptance", "better": "higher"}
    with pytest.raises(BaselineError, match=r"field 'figures.acceptance/free-text/tokens_per_round' is not one the "):
        load_baseline(_write(tmp_path, doc))
    doc = _baseline()
    del doc["figures"]["acceptance/code-edit/position_3"]
    with pytest.raises(BaselineError, match=r"'figures.acceptance/code-edit/position_3' is missing: the acceptance"):
        load_baseline(_write(tmp_path, doc))


FIGURE_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "negative",
        "code-edit/reference/checkpoint/k4/tokens_per_round",
        {"value": -2.5},
        "is -2.5: a count or a ratio is never negative",
    ),
    (
        "timed-as-a-count",
        "code-edit/reference/checkpoint/k4/speedup",
        {"kind": "machine_independent"},
        "is 'machine_independent', but a speedup figure is of kind 'mean_ratio' or 'ratio'",
    ),
    (
        "direction-turned",
        "code-edit/reference/checkpoint/k4/forwards_per_token",
        {"better": "higher"},
        "is 'higher', but for forwards_per_token lower is better",
    ),
]


@pytest.mark.parametrize(("key", "edit", "message"), [c[1:] for c in FIGURE_CASES], ids=[c[0] for c in FIGURE_CASES])
def test_speed_figures_of_the_wrong_kind_direction_or_sign_are_refused(
    tmp_path: Path, key: str, edit: dict[str, Any], message: str
) -> None:
    doc = make_baseline(speed_result())
    doc["figures"][key].update(edit)
    path = _write(tmp_path, doc)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    field = f"figures.{key}.{next(iter(edit))}"
    assert str(info.value) == f"baseline {path}: field {field!r} {message}"


def test_an_acceptance_rate_above_one_is_refused(tmp_path: Path) -> None:
    doc = _baseline()
    doc["figures"]["acceptance/code-edit/position_1"]["value"] = 1.5
    path = _write(tmp_path, doc)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    field = "figures.acceptance/code-edit/position_1.value"
    assert str(info.value) == f"baseline {path}: field {field!r} is 1.5: an acceptance rate is at most 1"


def test_the_cli_refuses_an_inconsistent_baseline_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import specproof.bench as bench

    monkeypatch.setattr(bench, "run_drafter_bench", lambda *a, **k: pytest.fail("measured despite a bad baseline"))
    doc = copy.deepcopy(_baseline())
    doc["acceptance"]["workloads"][1]["accepts_by_position"][0] = 13
    path = _write(tmp_path, doc)
    assert main(["bench", "--quick", "--drafter", "ngram", "--gate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"baseline {path}: field '{W1}.accepts_by_position[0]' is 13: more accepted tokens than the 12" in err
    assert "Traceback" not in err and err.count("\n") == 1, err
