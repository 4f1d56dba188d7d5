"""Issue 26 (a new user's first hour), the commands' words: `generate` names its drafter and gives a
feature drafter its target, `check-trace` ends with a verdict line as certify does, and `fuzz`
interrupted by Ctrl-C says INTERRUPTED."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main


def test_generate_names_the_drafter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--drafter", "ngram:2,3", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "drafter" in out and "ngram:2,3" in out and "k=4" in out
    assert main(["generate", "--drafter", "ngram:2,3", "--max-new-tokens", "8", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "NgramDrafter(min_n=2, max_n=3" in summary["drafter"]


@pytest.mark.parametrize("drafter", ["eagle:trained", "mtp:trained"])
def test_generate_with_a_feature_drafter_defaults_the_target_it_reads(
    drafter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--drafter eagle:trained` without `--target` decodes on `trained` (as certify does), losslessly;
    with another model named it is a usage error naming the fix, not a shape error."""
    code = main(["generate", "--drafter", drafter, "--max-new-tokens", "12", "--compare-greedy", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["target"] == "trained" and summary["equal_to_greedy"] is True
    assert main(["generate", "--drafter", drafter, "--target", "reference", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--target trained" in err and "Traceback" not in err


def test_check_trace_ends_with_a_full_verdict_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    assert main(["generate", "--max-new-tokens", "12", "--trace", str(trace), "--json"]) == 0
    capsys.readouterr()
    assert main(["check-trace", str(trace), "--target"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("verdict: PASS (") and "pass" in last and "rounds" in last, last
    # a broken trace: the verdict line names what failed
    lines = trace.read_text().splitlines()
    header, rounds = lines[0], [json.loads(line) for line in lines[1:]]
    record = next(r for r in rounds if r.get("type", "round") == "round" and r.get("accepted"))
    record["accepted"] = [int(t) + 1 for t in record["accepted"]]
    trace.write_text("\n".join([header, *(json.dumps(r) for r in rounds)]) + "\n")
    code = main(["check-trace", str(trace), "--target"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 1 and last.startswith("verdict: FAIL (") and "failed: " in last, last


class _InterruptedCampaign:
    """What run_campaign returns after Ctrl-C: some checks finished and passed."""

    stopped = "interrupted (Ctrl-C)"

    def __init__(self, report: dict[str, Any]) -> None:
        self._report = report

    def report(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._report))


def test_fuzz_interrupted_says_interrupted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import specproof.conformance._campaign as campaign
    import specproof.conformance.cli_support as cli_support
    from specproof.conformance import certify

    finished = certify("drafter", only=("drafter.max-length",)).to_json()
    assert finished["verdict"] == "pass"  # what the campaign's merged checks would say on their own
    finished["campaign"] = {
        "workers": 1,
        "rounds": 1,
        "examples": 3,
        "seconds": 1.0,
        "time_to_first_failure": None,
        "stopped": "interrupted (Ctrl-C)",
        "worker_errors": [],
    }
    # the CLI reaches the campaign through conformance.cli_support: replace it there (and at home)
    fake = lambda options, on_event=None: _InterruptedCampaign(finished)  # noqa: E731
    monkeypatch.setattr(campaign, "run_campaign", fake)
    monkeypatch.setattr(cli_support, "run_campaign", fake)
    out_file = tmp_path / "f.json"
    args = ["fuzz", "drafter", "--only", "drafter.max-length", "--report", str(out_file)]
    code = main([*args, "--hypothesis-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 130
    assert "verdict: INTERRUPTED" in out and "verdict: PASS" not in out, out[-1500:]
    assert json.loads(out_file.read_text())["verdict"] == "interrupted"


def test_the_certify_table_prints_a_failures_detail_verbatim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A detail begins "[drafter.max-length]: ..."; printed as rich markup, the bracketed id vanished and the
    table showed ": asked for ...". The id and the detail are plain text."""
    drafter = "specproof.conformance.zoo:too_long"
    args = ["certify", "drafter", "--drafter", drafter, "--only", "drafter.max-length", "--db", "none"]
    assert main([*args, "--hypothesis-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("│ drafter.max-length"))
    assert "[drafter.max-length]: asked for at most" in row, row
