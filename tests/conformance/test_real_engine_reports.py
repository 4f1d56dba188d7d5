"""Issue 35, "real engines polished", on the certificate: a speculating engine's drafted and accepted counts
(screen, Markdown and JSON), a black box without stats told so (not "0 drafted"), one failure shared by
every check told once with the checks it stopped, and a known upstream cause named in the failure.

The engines here are the zoo's black boxes; tests/frameworks/test_vllm_*.py and test_llamacpp_*.py hold
the real vLLM and llama.cpp to the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main
from specproof.conformance.reports import failure_groups, speculation_summary
from specproof.conformance.zoo._engines import GreedyOnlyEngine, RaisesEveryCall
from specproof.contract import Generation, Stats
from specproof.formats import report as report_format

HERE = "test_real_engine_reports"


class TotalsOnly(GreedyOnlyEngine):
    """Correct black box reporting its drafted and accepted totals only (as vLLM's summary metrics do)."""

    def generate(self, prompt: Any, max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        st = gen.stats or Stats()
        stats = Stats(emitted=st.emitted, drafted=st.drafted, accepted=st.accepted)
        return Generation(tokens=gen.tokens, stop_reason=gen.stop_reason, stats=stats)


class NoStats(GreedyOnlyEngine):
    """Correct black box with no steps and no stats: nothing shows what it drafted."""

    def generate(self, prompt: Any, max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        return Generation(tokens=gen.tokens, stop_reason=gen.stop_reason)


class CrashesWithAKnownCause(RaisesEveryCall):
    """Every request crashes, and the engine knows why (as the real-engine adapters' table does)."""

    def known_cause(self, invariant: str) -> str | None:
        return "known cause (docs/real-engines.md, zoo finding): the zoo's crash; workaround: none needed"


class PassesWithAKnownCause(GreedyOnlyEngine):
    """Correct, with a known_cause for every check: a cause is named on a failure only."""

    def known_cause(self, invariant: str) -> str | None:
        return "known cause (docs/real-engines.md, zoo finding): never shown; workaround: none"


def greedy_only() -> GreedyOnlyEngine:
    return GreedyOnlyEngine()


def totals_only() -> TotalsOnly:
    return TotalsOnly()


def no_stats() -> NoStats:
    return NoStats()


def crashes_with_a_known_cause() -> CrashesWithAKnownCause:
    return CrashesWithAKnownCause()


def passes_with_a_known_cause() -> PassesWithAKnownCause:
    return PassesWithAKnownCause()


def _certify(args: list[str], tmp_path: Path) -> tuple[int, dict[str, Any], str]:
    report, md = tmp_path / "r.json", tmp_path / "r.md"
    code = main(
        ["certify", *args, "--report", str(report), "--markdown", str(md), "--hypothesis-dir", str(tmp_path / "h")]
    )
    document = json.loads(report.read_text())
    assert report_format.FORMAT.validate(document) == []  # the schema holds the new fields
    return code, document, md.read_text()


# --------------------------------------------------------------------------- drafted and accepted counts


@pytest.mark.slow
def test_a_black_box_with_stats_shows_its_drafted_and_accepted_counts(tmp_path: Path, capsys) -> None:
    code, report, md = _certify(["engine", "--engine", f"{HERE}:totals_only", "--only", "engine.lossless"], tmp_path)
    out = capsys.readouterr().out
    assert code == 0, report["verdict_reason"]
    (row,) = report["speculation"].values()
    assert row["with_stats"] == row["generations"] > 0 and row["drafted"] > 0
    assert 0 <= row["accepted"] <= row["drafted"] and row["acceptance"] == round(row["accepted"] / row["drafted"], 4)
    assert row["by_position"] is None and "acceptance by draft position" not in out  # it reports totals only
    line = f"{row['drafted']} drafted, {row['accepted']} accepted"
    assert line in out and line in md and "## Speculation" in md


@pytest.mark.slow
def test_acceptance_per_position_is_shown_where_the_engine_reports_it(tmp_path: Path, capsys) -> None:
    code, report, md = _certify(["engine", "--engine", f"{HERE}:greedy_only", "--only", "engine.lossless"], tmp_path)
    out = capsys.readouterr().out
    assert code == 0, report["verdict_reason"]
    (row,) = report["speculation"].values()
    positions = row["by_position"]
    assert sum(p["attempts"] for p in positions) == row["drafted"]
    assert sum(p["accepted"] for p in positions) == row["accepted"]
    first = positions[0]
    cell = f"0: {first['accepted']}/{first['attempts']} ({first['rate']:.0%})"
    assert f"acceptance by draft position: {cell}" in out and f"acceptance by draft position: {cell}" in md


@pytest.mark.slow
def test_a_black_box_without_stats_is_told_it_has_none_not_zero_drafted(tmp_path: Path, capsys) -> None:
    code, report, md = _certify(["engine", "--engine", f"{HERE}:no_stats", "--only", "engine.lossless"], tmp_path)
    out = capsys.readouterr().out
    assert code == 3 and report["verdict"] == "inconclusive"
    (row,) = report["speculation"].values()
    n = row["generations"]
    assert (row["with_stats"], row["drafted"]) == (0, 0)
    assert (
        f"no_stats: {n} generations, no rounds (it returns no steps) and no stats (Generation.stats is None); "
        "return Stats(drafted=..., accepted=...) from generate to show what it drafted"
    ) in report["verdict_reason"]
    assert "0 drafted tokens" not in report["verdict_reason"] and "0 drafted" not in out
    told = (
        f"{n} generations, no stats (Generation.stats is None): what it drafted is unknown; return "
        "Stats(drafted=..., accepted=...) from generate to show it"
    )
    assert told in out and told in md


def test_the_speculation_summary_words() -> None:
    row = {"generations": 5, "with_stats": 5, "drafted": 40, "accepted": 30, "acceptance": 0.75}
    assert speculation_summary(row) == "40 drafted, 30 accepted (75.0% accepted) over 5 generations"
    partial = {**row, "with_stats": 3}
    assert speculation_summary(partial).endswith("(stats on 3 of 5 generations)")
    nothing = {**row, "drafted": 0, "accepted": 0, "acceptance": None}
    assert speculation_summary(nothing) == "0 drafted, 0 accepted over 5 generations"
    assert speculation_summary({**row, "with_stats": 0}).startswith("5 generations, no stats")


# --------------------------------------------------------------------------- one failure, told once


def _crash(invariant: str, cause: str = "RuntimeError: boom", suffix: str = "") -> dict[str, Any]:
    text = f"the generation did not complete: the engine E raised {cause}{suffix}"
    return {
        "invariant": invariant,
        "case": "c",
        "status": "fail",
        "detail": text,
        "violations": [{"invariant": invariant, "explanation": text, "example": {"prompt": [1]}}],
    }


def _own(invariant: str, text: str) -> dict[str, Any]:
    return {"invariant": invariant, "case": "c", "status": "fail", "detail": text,
            "violations": [{"invariant": invariant, "explanation": text, "example": {}}]}  # fmt: skip


def test_a_crash_shared_by_checks_is_one_group_and_own_failures_stay_apart() -> None:
    results = [
        _crash("engine.lossless"),
        _own("engine.stop", "stopped after 2 tokens but plain greedy emits 3"),
        _crash("engine.kv-length", suffix=" (so engine.kv-length could not be checked)"),
        _crash("engine.session", suffix=" [greedy stops at max_new_tokens]"),
        _own("engine.cost", "3 forwards, expected 2"),
    ]
    groups = failure_groups(results)
    assert [(cause, [r["invariant"] for r in g]) for cause, g in groups] == [
        (
            "the generation did not complete: the engine E raised RuntimeError: boom",
            ["engine.lossless", "engine.kv-length", "engine.session"],
        ),
        (None, ["engine.stop"]),
        (None, ["engine.cost"]),
    ]


def test_different_crashes_and_a_lone_crash_are_told_each() -> None:
    results = [_crash("engine.lossless", "RuntimeError: a"), _crash("engine.stop", "RuntimeError: b")]
    assert [cause for cause, _ in failure_groups(results)] == [None, None]
    lone = _crash("engine.lossless")
    assert failure_groups([lone, _own("engine.stop", "its own finding")]) == [
        (None, [lone]),
        (None, [_own("engine.stop", "its own finding")]),
    ]


@pytest.mark.slow
def test_every_request_crashing_is_told_once_with_the_checks_it_stopped(tmp_path: Path, capsys) -> None:
    code, report, md = _certify(["engine", "--engine", f"{HERE}:crashes_with_a_known_cause"], tmp_path)
    out = capsys.readouterr().out
    failed = [r for r in report["results"] if r["status"] == "fail"]
    assert code == 1 and len(failed) >= 10
    assert out.count("raised RuntimeError: engine crashed") == len(failed) + 1  # the table's rows, and once below
    below = out.split("──── ", 1)[1]
    assert below.count("engine crashed (zoo: RaisesEveryCall)") == 1
    assert below.startswith(f"one failure stopped {len(failed)} checks ────")
    assert "checks it stopped: " + ", ".join(r["invariant"] for r in failed) in below
    assert md.count("engine crashed (zoo: RaisesEveryCall)") == len(failed) + 1  # table rows + one section
    assert f"## One failure stopped {len(failed)} checks — fail" in md
    # the known cause, named once in the shared block and in every check's JSON violation
    assert below.count("known cause (docs/real-engines.md, zoo finding)") == 1
    assert all("zoo finding" in v["explanation"] for r in failed for v in r["violations"])


@pytest.mark.slow
def test_a_known_cause_is_named_on_failures_only(tmp_path: Path, capsys) -> None:
    code, report, md = _certify(
        ["engine", "--engine", f"{HERE}:passes_with_a_known_cause", "--only", "engine.lossless"], tmp_path
    )
    assert code == 0 and "known cause" not in capsys.readouterr().out + md + json.dumps(report)
