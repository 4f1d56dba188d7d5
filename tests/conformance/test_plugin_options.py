"""The pytest plugin takes every ``specproof certify`` option, from the same definitions.

A ``certify`` option with no ``--specproof-*`` twin and no documented reason
(``_options.NOT_IN_PLUGIN``) fails here; the plugin checks its values before any work, as
``certify`` does (a bad ``--specproof-db`` is a usage error), and its database is the one
``certify`` uses: what a seeded pytest run saves, a derandomized ``certify`` replays.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specproof
from specproof._cli import certify as certify_cli
from specproof.cli import main
from specproof.conformance import plugin
from specproof.conformance._options import NOT_IN_PLUGIN, OPTIONS

SRC = str(Path(specproof.__file__).parent.parent)


def _certify_parser() -> argparse.ArgumentParser:
    sub = argparse.ArgumentParser().add_subparsers()
    certify_cli.add_parser(sub)
    return sub.choices["certify"]  # type: ignore[no-any-return]


def _without_twin(parser: argparse.ArgumentParser) -> list[str]:
    """certify's options that neither have a plugin twin nor a reason not to."""
    twins = {o.dest for o in OPTIONS}
    return [a.dest for a in parser._actions if a.dest not in twins and a.dest not in NOT_IN_PLUGIN]


class _Group:
    def __init__(self) -> None:
        self.flags: dict[str, dict[str, object]] = {}

    def addoption(self, flag: str, **kwargs: object) -> None:
        self.flags[flag] = kwargs


class _Parser:
    def __init__(self) -> None:
        self.group = _Group()

    def getgroup(self, name: str, description: str = "") -> _Group:
        return self.group


def test_every_certify_option_has_a_plugin_twin_or_a_reason() -> None:
    parser = _certify_parser()
    assert _without_twin(parser) == []
    # the check can fail: a new certify option with no twin is named
    parser.add_argument("--new-knob", default=None)
    assert _without_twin(parser) == ["new_knob"]
    # ...and passes once it has a documented reason
    assert [d for d in _without_twin(parser) if d not in {"new_knob": "why"}] == []


def test_the_plugin_registers_every_twin_with_certifys_definition() -> None:
    fake = _Parser()
    plugin.pytest_addoption(fake)  # type: ignore[arg-type]
    assert set(fake.group.flags) == {o.plugin for o in OPTIONS}
    by_flag = {a.option_strings[0] if a.option_strings else a.dest: a for a in _certify_parser()._actions}
    for option in OPTIONS:
        twin, mine = fake.group.flags[option.plugin], by_flag[option.cli or option.dest]
        assert twin["dest"] == "specproof_" + option.dest
        assert twin["help"] == mine.help and twin.get("type") == mine.type and twin.get("choices") == mine.choices
        assert twin["default"] == mine.default


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "specproof.conformance", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--specproof-db", "redis://"],
            "--specproof-db 'redis://': not a Redis URL: it names no host "
            "(redis-py would take localhost:6379 in silence)",
        ),
        (["--specproof-db", "redis://127.0.0.1:1/0"], "the Redis server does not answer"),
        (["--specproof-db", "/no/such/dir/db"], "--specproof-db '/no/such/dir/db': the directory"),
        (["--specproof-expect-fail", "engine.nonesuch"], "is not an invariant id"),
        # a declaration for a check the run deselects means nothing (issue 27)
        (["--specproof-only", "engine.stop", "--specproof-expect-fail", "engine.lossless"], "that check does not run"),
        (["--specproof-hypothesis-dir", "/no/such/dir/h"], "--specproof-hypothesis-dir '/no/such/dir/h'"),
        (["--specproof-profile", "fast"], "unknown profile 'fast'"),
        (["--specproof-engine", "nosuchmodule:make"], "nosuchmodule"),
        (["--specproof-only", "engine.nonesuch"], "matches no invariant id"),
    ],
)
def test_bad_values_are_usage_errors_before_any_work(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest in-process (as certify runs it): the plugin's option checks are all this exercises, and
    # nothing of a process; a pytest process each cost a second of imports
    monkeypatch.chdir(tmp_path)
    pyargs = ["-p", "no:cacheprovider", "-q", "--capture=no", "--pyargs", "specproof.conformance"]
    code = pytest.main([*pyargs, *args, "--specproof-report", str(tmp_path / "r.json")])
    out = capsys.readouterr()
    assert code == pytest.ExitCode.USAGE_ERROR, out.out + out.err
    assert message in out.err
    assert not (tmp_path / "r.json").exists() and "passed" not in out.out


@pytest.mark.slow  # a pytest process and a certify run, after the seed search: seconds
def test_a_seeded_pytest_run_saves_what_a_derandomized_certify_replays(
    tmp_path: Path, seed_reaching_max_context: int
) -> None:
    db, report, markdown = tmp_path / "db", tmp_path / "r.json", tmp_path / "r.md"
    opts = ["--specproof-subject", "engine", "--specproof-only", "engine.stop", "--specproof-max-context", "4096"]
    out = _pytest(
        *opts,
        *["--specproof-seed", str(seed_reaching_max_context), "--specproof-db", str(db)],
        *["--specproof-report", str(report)],
        *["--specproof-markdown", str(markdown)],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    saved = json.loads(report.read_text())
    assert saved["database"]["covering_saved"].keys() == {"checkpoint", "replay"}
    assert saved["subjects"]["engines"] and "engine.stop" in markdown.read_text()
    code = main(
        [
            "certify",
            "engine",
            "--only",
            "engine.stop",
            "--max-context",
            "4096",
            "--db",
            str(db),
            "--report",
            str(report),
        ]
    )
    assert code == 0
    gate = json.loads(report.read_text())
    assert gate["database"]["covering_replayed"] == {"checkpoint": 1, "replay": 1}
    assert all(row["clamped_at_max_context"] for row in gate["path_coverage"].values())


def test_the_plan_takes_its_options_from_one_mapping() -> None:
    """``plan_arguments`` (from ``OPTIONS``) is the only mapping from options to ``Plan.create``: every
    option marked ``plan`` is an argument of the same name, and every argument but the resolved ones
    (the database, the storage, the expected failures) is such an option."""
    import inspect

    from specproof.conformance import Plan
    from specproof.conformance._options import OPTIONS
    from specproof.conformance.cli_support import plan_arguments

    arguments = set(inspect.signature(Plan.create).parameters) - {"cls"}
    in_plan = {o.dest for o in OPTIONS if o.plan}
    assert in_plan <= arguments
    assert arguments - in_plan == {"storage", "database", "expected_failures"}
    values = {o.dest: o.default for o in OPTIONS} | {"only": ["engine.stop", "engine.lossless"], "seed": 7}
    mapped = plan_arguments(values)
    assert set(mapped) == in_plan and mapped["only"] == ("engine.stop", "engine.lossless") and mapped["seed"] == 7
    assert set(plan_arguments(values, ("profile", "report"))) == {"profile"}  # report is no plan argument


def test_certify_and_the_plugin_build_the_same_plan(tmp_path: Path) -> None:
    from specproof.conformance import Plan
    from specproof.conformance._options import OPTIONS
    from specproof.contract import UsageError

    values = {o.dest: o.default for o in OPTIONS} | {
        "target": "reference",
        "only": ["engine.stop"],
        "seed": 3,
        "max_context": 64,
        "db": "none",
        "hypothesis_dir": str(tmp_path / "hyp"),
        "expect_fail": ["engine.stop=known"],
    }
    cli, plugin = Plan.from_options(values), Plan.from_options(values, flags="plugin")
    fields = ("specs", "profile", "only", "seed", "max_context", "expected_failures", "storage", "database")
    assert [getattr(cli, f) for f in fields] == [getattr(plugin, f) for f in fields]
    assert (cli.only, cli.seed, cli.max_context, cli.expected_failures) == (
        ("engine.stop",),
        3,
        64,
        {"engine.stop": "known"},
    )
    assert cli.storage == str(tmp_path / "hyp") and cli.database is None  # (the directory named, not its parent)
    with pytest.raises(UsageError, match="--specproof-hypothesis-dir"):
        Plan.from_options(values | {"hypothesis_dir": str(tmp_path / "missing" / "hyp")}, flags="plugin")


def test_the_plugin_keeps_hypothesis_files_in_the_named_directory(tmp_path: Path) -> None:
    """``--specproof-hypothesis-dir DIR``: Hypothesis' files (its constants cache, the examples) go
    there, as under ``specproof certify``; nothing in the working directory (no ``.hypothesis/``)."""
    cwd, hyp = tmp_path / "cwd", tmp_path / "hyp"
    cwd.mkdir()
    # a failing check, so something is surely written: its example (Hypothesis' constants cache is
    # written only for source outside site-packages, so an installed wheel may write nothing else)
    args = ["--specproof-drafter", "specproof.conformance.zoo:too_long", "--specproof-only", "drafter.max-length"]
    out = _pytest("-p", "no:benchmark", *args, "--specproof-hypothesis-dir", str(hyp), cwd=cwd)
    assert out.returncode == pytest.ExitCode.TESTS_FAILED, out.stdout + out.stderr
    assert list(cwd.iterdir()) == []
    assert any(p.is_file() for p in (hyp / "examples").rglob("*"))  # (the failing example was saved: here)


def test_the_plugin_refuses_an_unwritable_session_history_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As certify does: the sessions/ directory of --specproof-hypothesis-dir is probed before any work."""
    home = tmp_path / "hyp"
    home.mkdir()
    (home / "sessions").write_text("in the way")  # a file where the session histories go
    monkeypatch.chdir(tmp_path)  # pytest in-process, as in test_bad_values_are_usage_errors_before_any_work
    pyargs = ["-p", "no:cacheprovider", "-q", "--capture=no", "--pyargs", "specproof.conformance"]
    code = pytest.main([*pyargs, "--specproof-hypothesis-dir", str(home), "--specproof-only", "engine.stop"])
    err = capsys.readouterr().err
    assert code == pytest.ExitCode.USAGE_ERROR, err
    assert str(home / "sessions") in err and "cannot be written" in err, err
