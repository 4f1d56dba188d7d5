"""A check that fails under the pytest plugin says what ``specproof certify`` would: each violation
with its minimal example (bounded) and the reproduce command, which, pasted, fails again.

- ``engine.session`` on the zoo's ``prefix_hit_zero_features`` (under ``--specproof-hypothesis-dir D``):
  the failure names the request history and the session file under ``D/sessions/`` it replays.
- ``drafter.no-mutation`` on ``mutates_on_later_request``: the example (the session's requests) and
  the seed-based reproduce line.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import specproof
from specproof.cli import main
from specproof.conformance._results import CheckResult
from specproof.conformance.plugin import failure_text
from specproof.contract import Violation

pytestmark = pytest.mark.slow  # pytest runs in a subprocess: outside `tox -e quick`, always in `tox`

SRC = str(Path(specproof.__file__).parent.parent)
ZOO = "specproof.conformance.zoo"


def _pytest(tmp_path: Path, *options: str) -> str:
    """``pytest --pyargs specproof.conformance OPTIONS`` from an empty directory; its output (it must fail)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "specproof.conformance", *options],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    assert out.returncode == pytest.ExitCode.TESTS_FAILED, out.stdout + out.stderr
    return out.stdout


def _reproduce(output: str) -> list[str]:
    [line] = [ln for ln in output.splitlines() if ln.startswith("E       reproduce: ")]
    argv = shlex.split(line.removeprefix("E       reproduce: "))
    assert argv[:2] == ["specproof", "certify"], line
    return argv


def test_a_session_failure_under_pytest_names_its_history_file_and_reproduces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hyp = tmp_path / "hyp"
    output = _pytest(
        tmp_path,
        *("--specproof-engine", f"{ZOO}:prefix_hit_zero_features", "--specproof-hypothesis-dir", str(hyp)),
        *("-k", "engine.session"),
    )
    assert "[engine.session]: request 1 (multi_turn)" in output and "all zeros" in output, output
    assert 'E           minimal example: {"history": [{"kind": "new_prompt"' in output, output
    argv = _reproduce(output)
    history = Path(argv[argv.index("--replay-session") + 1])
    assert history.is_relative_to(hyp / "sessions") and history.is_file(), history
    monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(tmp_path))  # the pasted line writes nothing elsewhere
    assert main(argv[1:]) == 1  # pasted, it fails again


def test_a_drafter_failure_under_pytest_shows_its_example_and_reproduce_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hyp = tmp_path / "hyp"
    output = _pytest(
        tmp_path,
        *("--specproof-drafter", f"{ZOO}:mutates_on_later_request", "--specproof-hypothesis-dir", str(hyp)),
        *("-k", "drafter.no-mutation"),
    )
    assert "[drafter.no-mutation]: propose changed the context it was given" in output, output
    assert 'E           minimal example: {"context": ' in output and '"walk": [' in output, output
    argv = _reproduce(output)
    assert "--drafter" in argv and "drafter.no-mutation" in argv, argv
    monkeypatch.setenv("SPECPROOF_HYPOTHESIS_DIR", str(tmp_path))
    assert main(argv[1:]) == 1  # pasted, it fails again


def test_the_failure_text_bounds_a_large_example_and_keeps_the_reproduce_line() -> None:
    result = CheckResult(nodeid="n", invariant="engine.session", case="c", reproduce="specproof certify x")
    result.fail([Violation(invariant="engine.session", explanation="why", example={"prompt": list(range(5000))})])
    text = failure_text(result)
    [example] = [ln for ln in text.splitlines() if "minimal example: " in ln]
    assert len(example.split("minimal example: ", 1)[1]) == 3000 and example.endswith("..."), len(example)
    assert text.splitlines()[0] == "[engine.session]: why" and text.endswith("\nreproduce: specproof certify x")
    # no example, no reproduce line: the violation alone
    bare = CheckResult(nodeid="n", invariant="engine.session", case="c")
    bare.fail([Violation(invariant="engine.session", explanation="why")])
    assert failure_text(bare) == "[engine.session]: why"
