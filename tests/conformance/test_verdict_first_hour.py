"""Issue 26 (a new user's first hour), the certify side: plug-ins in the working directory are found,
one drafter bug is told once, a PASS needs an observed speculative round, and the certificate states
the tolerances in force and the built-in engine's capabilities truthfully."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main
from specproof.conformance.zoo._drafters import TooLong
from specproof.conformance.zoo._engines import GreedyOnlyEngine
from specproof.contract import Generation
from specproof.formats import problems

SRC = str(Path(__file__).resolve().parents[2] / "src")
HERE = "test_verdict_first_hour"


def too_long() -> TooLong:
    """drafter.max-length: pads its draft to k + 1 tokens."""
    return TooLong()


class NeverSeenDrafting(GreedyOnlyEngine):
    """Black-box, no steps, no stats: nothing shows that it ever speculated."""

    def generate(self, prompt: Any, max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        gen = super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        return Generation(tokens=gen.tokens, stop_reason=gen.stop_reason)


class DeclaredPlainGreedy(NeverSeenDrafting):
    """The same engine, stating that it does not speculate."""

    speculative = False


def never_seen_drafting() -> NeverSeenDrafting:
    return NeverSeenDrafting()


def declared_plain_greedy() -> DeclaredPlainGreedy:
    return DeclaredPlainGreedy()


def _certify(args: list[str], tmp_path: Path) -> tuple[int, dict[str, Any], str]:
    report, md = tmp_path / "r.json", tmp_path / "r.md"
    code = main(
        ["certify", *args, "--report", str(report), "--markdown", str(md), "--hypothesis-dir", str(tmp_path / "h")]
    )
    return code, json.loads(report.read_text()), md.read_text()


# --------------------------------------------------------------------------- plug-ins where the user stands


def _subprocess_env() -> dict[str, str]:
    # the worktree's source, and nothing that would put the plug-in's folder on sys.path
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = SRC
    return env


def test_a_plugin_in_the_working_directory_is_found(tmp_path: Path) -> None:
    """`specproof certify drafter --drafter mymod:make` from the folder holding mymod.py (no PYTHONPATH=.).
    ``python -P`` keeps the folder off sys.path, as the `specproof` console script does; the reproduce
    line of a failing check says where to run it from."""
    (tmp_path / "mymod.py").write_text(
        textwrap.dedent(
            """
            from specproof.conformance.zoo._drafters import LookupDrafter, TooLong

            def make():
                return LookupDrafter()

            def broken():
                return TooLong()
            """
        )
    )
    base = [sys.executable, "-P", "-m", "specproof", "certify", "drafter", "--only", "drafter.max-length"]
    db = ["--hypothesis-dir", str(tmp_path / "h")]
    ok = subprocess.run(
        [*base, "--drafter", "mymod:make", *db], cwd=tmp_path, env=_subprocess_env(), capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr
    assert "verdict: PASS" in ok.stdout
    bad = subprocess.run(
        [*base, "--drafter", "mymod:broken", *db], cwd=tmp_path, env=_subprocess_env(), capture_output=True, text=True
    )
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr
    assert f"reproduce: cd {tmp_path} && specproof certify drafter --drafter mymod:broken" in bad.stdout
    fuzz = [sys.executable, "-P", "-m", "specproof", "fuzz", "drafter", "--drafter", "mymod:make", "--rounds", "1"]
    fuzzed = subprocess.run(  # spawned workers resolve the spec again, in the same folder
        [*fuzz, "--only", "drafter.max-length", "--workers", "1", *db],
        cwd=tmp_path,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert fuzzed.returncode == 0 and "verdict: PASS" in fuzzed.stdout, fuzzed.stdout[-2000:] + fuzzed.stderr
    assert "1 round(s)" in fuzzed.stdout, fuzzed.stdout[-2000:]  # a count of rounds, not a time: the same at any load
    missing = subprocess.run(
        [*base, "--drafter", "nosuchmod:make"], cwd=tmp_path, env=_subprocess_env(), capture_output=True, text=True
    )
    assert missing.returncode == 2 and "working directory" in missing.stderr and "Traceback" not in missing.stderr


def test_an_installed_module_is_never_shadowed_by_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    from specproof.engine.plugin_modules import import_plugin_module

    (tmp_path / "json.py").write_text("raise RuntimeError('shadowed the standard library')\n")
    (tmp_path / "herebymod.py").write_text("VALUE = 7\n")
    import specproof.engine.plugin_modules as plugins

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.setattr(plugins, "_FOUND_IN", {})  # this process's other certifications must not see it
    assert import_plugin_module("json") is json
    assert import_plugin_module("herebymod").VALUE == 7
    assert sys.path[-1] == str(tmp_path)  # appended after everything installed
    assert plugins.plugin_directory("herebymod:VALUE") == str(tmp_path)
    assert plugins.plugin_directory("json:loads") is None
    monkeypatch.delitem(sys.modules, "herebymod")


# --------------------------------------------------------------------------- one failure told once


def test_one_drafter_bug_is_one_failure_block_with_its_consequences_counted(tmp_path: Path, capsys) -> None:
    code, report, md = _certify(["drafter", "--drafter", f"{HERE}:too_long"], tmp_path)
    out = capsys.readouterr().out
    assert code == 1 and report["verdict"] == "fail"
    assert problems("report-2", report) == []
    by_status: dict[str, list[dict[str, Any]]] = {}
    for r in report["results"]:
        by_status.setdefault(r["status"], []).append(r)
    assert [r["id"] for r in by_status["fail"]] == ["drafter.max-length"]
    followed = by_status["consequence"]
    assert len(followed) >= 10 and all(r["consequence_of"] == ["drafter.max-length"] for r in followed)
    assert {"checkpoint-engine.lossless", "checkpoint-engine.features"} <= {r["id"] for r in followed}
    assert all(r["case"] != "drafter" for r in followed)
    # the terminal: one failure block, and the verdict line counts the rest
    blocks = re.findall(r"^──── (.*) ────$", out, flags=re.M)
    assert blocks == ["drafter.max-length (drafter)"], blocks
    assert f"{len(followed)} consequence" in out and "consequence of drafter.max-length" in out
    assert (
        f"{len(followed)} engine check(s) failed only as a consequence of drafter.max-length"
        in report["verdict_reason"]
    )
    # the certificate: one failure section, one line for the consequences
    assert md.count("\n## drafter.max-length (drafter)") == 1 and md.count(" — consequence\n") == 0
    assert "## Consequences of drafter.max-length" in md


def test_engine_failures_of_a_passing_drafter_are_not_consequences(tmp_path: Path) -> None:
    """A plug-in engine's own failure stays a failure, with the correct drafter or without one."""
    code, report, _ = _certify(
        ["engine", "--engine", "specproof.conformance.zoo:raises_every_call", "--only", "engine.kv-length"], tmp_path
    )
    assert code == 1 and {r["status"] for r in report["results"]} == {"fail"}
    assert not any("consequence_of" in r for r in report["results"])


# --------------------------------------------------------------------------- a PASS that never speculated


def test_an_engine_never_seen_speculating_is_inconclusive(tmp_path: Path, capsys) -> None:
    code, report, _ = _certify(["engine", "--engine", f"{HERE}:never_seen_drafting"], tmp_path)
    out = capsys.readouterr().out
    assert code == 3 and report["verdict"] == "inconclusive", report["verdict_reason"]
    assert "no speculative round was observed" in report["verdict_reason"]
    assert "speculative = False" in report["verdict_reason"]
    assert "verdict: INCONCLUSIVE" in out and "no speculative round" in out
    assert not [r for r in report["results"] if r["status"] in ("fail", "error")]


def test_an_engine_that_declares_it_does_not_speculate_can_pass(tmp_path: Path) -> None:
    code, report, md = _certify(["engine", "--engine", f"{HERE}:declared_plain_greedy"], tmp_path)
    assert code == 0 and report["verdict"] == "pass", report["verdict_reason"]
    (engine,) = report["subjects"]["engines"]
    assert any("speculative = False" in n for n in engine["notes"])
    assert "speculative = False" in md


# --------------------------------------------------------------------------- the certificate's words


def test_certificate_states_tolerances_and_builtin_capabilities(tmp_path: Path) -> None:
    code, report, md = _certify(["--only", "engine.lossless"], tmp_path)
    assert code == 0
    assert "None" not in md.split("\n| invariant")[0], md[:800]
    assert "tie tolerance 0 (the target's), atol 0 (the target's)" in md
    for engine in report["subjects"]["engines"]:
        caps = engine["capabilities"]
        assert caps["live_target"] and caps["suite_drafts"] and caps["oracle"] and caps["steps"], caps
    code, report, md = _certify(["--only", "engine.lossless", "--tie-tolerance", "0.25"], tmp_path)
    assert "tie tolerance 0.25 (given)" in md


@pytest.mark.parametrize("status", ["consequence"])
def test_junit_counts_a_consequence_as_skipped_not_failed(status: str) -> None:
    from specproof.conformance.reports import render_junit

    row = {
        "id": "checkpoint-engine.lossless",
        "invariant": "engine.lossless",
        "case": "checkpoint",
        "status": status,
        "examples": 3,
        "exercised": 3,
        "seconds": 0.1,
        "detail": "consequence of drafter.max-length",
        "violations": [],
    }
    xml = render_junit({"results": [row], "seconds": 0.1})
    assert 'failures="0"' in xml and 'skipped="1"' in xml
