"""A derandomized search draws the same examples whatever local code the process imported.

Hypothesis draws some choices from the literals of the "local" modules a process imported
(``specproof.strategies._local_constants`` says how); the project's searches run inside
``no_local_constants()``. Here: a module of distinctive integers, written outside site-packages
and imported between two draws, moves a plain derandomized test's examples and moves none inside
the context; a whole ``certify`` reaches the same rollback rounds in a process that imported it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import uuid

import hypothesis
import pytest
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from _targets import small_target
from specproof.strategies import no_local_constants, run_rollback_machine

# these tests compare draws with and without local constants: outside the tests' own context (conftest.py)
pytestmark = pytest.mark.local_constants

_VALUES = range(101, 4096, 7)  # integers Hypothesis collects (|n| >= 100), inside the draws' range


def _write_constants_module(folder: pathlib.Path) -> str:
    name = f"specproof_test_constants_{uuid.uuid4().hex}"
    (folder / f"{name}.py").write_text("VALUES = (\n" + "".join(f"    {v},\n" for v in _VALUES) + ")\n")
    return name


def _derandomized_draws() -> list[list[int]]:
    seen: list[list[int]] = []

    @hypothesis.settings(max_examples=60, derandomize=True, database=None, phases=[hypothesis.Phase.generate])
    @hypothesis.given(st.lists(st.integers(0, 4095), min_size=8, max_size=8))
    def draws(xs: list[int]) -> None:
        seen.append(xs)

    draws()
    return seen


def test_imported_constants_move_plain_draws_but_not_draws_inside(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with no_local_constants():
        inside_before = _derandomized_draws()
    plain_before = _derandomized_draws()
    monkeypatch.syspath_prepend(str(tmp_path))
    name = _write_constants_module(tmp_path)
    __import__(name)  # a new local module: its integers join Hypothesis' local pool
    try:
        plain_after = _derandomized_draws()
        with no_local_constants():
            inside_after = _derandomized_draws()
    finally:
        sys.modules.pop(name, None)
    # the probe is sensitive: Hypothesis still draws local constants (else the context is moot: see its module)
    assert plain_after != plain_before
    assert inside_after == inside_before


def _recording_target(fed: list[tuple[int, ...]]):  # type: ignore[no-untyped-def]
    """``small_target`` (by name too: the machine's class name, and so its derandomized seed, comes from it)
    recording every token block fed to every target: a fingerprint of every example drawn."""

    def small_target_() -> object:
        target = small_target()
        forward = target.forward

        def recorded(tokens, *args, **kwargs):  # type: ignore[no-untyped-def]
            fed.append(tuple(int(t) for t in tokens))
            return forward(tokens, *args, **kwargs)

        target.forward = recorded  # type: ignore[method-assign]
        return target

    small_target_.__name__ = "small_target"
    return small_target_


def _machine_run() -> list[tuple[int, ...]]:
    fed: list[tuple[int, ...]] = []
    search = hypothesis.settings(
        max_examples=8, derandomize=True, database=None, deadline=None, phases=[hypothesis.Phase.generate]
    )
    run_rollback_machine(target_factory=_recording_target(fed), stateful_step_count=6, settings=search)
    return fed


def test_run_rollback_machine_draws_the_same_examples_after_importing_local_constants(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A public driver called from a user's code (here, outside any context of the caller's) draws
    inside ``no_local_constants()`` itself: every token block fed to its targets is the same after a
    module of distinctive integers (sampling seeds can be drawn from them) was imported."""
    before = _machine_run()
    monkeypatch.syspath_prepend(str(tmp_path))
    name = _write_constants_module(tmp_path)
    __import__(name)
    try:
        after = _machine_run()
    finally:
        sys.modules.pop(name, None)
    assert before and after == before


def test_the_swapped_names_come_back_after_nested_and_threaded_uses() -> None:
    lookup, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
    entered = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with no_local_constants():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with no_local_constants():
        assert providers._get_local_constants is not lookup and providers.CONSTANTS_CACHE is not cache
        assert len(providers._get_local_constants()) == 0
        thread.start()
        assert entered.wait(10)
        with no_local_constants():
            pass
    assert providers._get_local_constants is not lookup  # the other thread is still inside
    leave.set()
    thread.join(10)
    assert providers._get_local_constants is lookup and providers.CONSTANTS_CACHE is cache


def test_a_hypothesis_without_the_swapped_names_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(providers, "_get_local_constants")
    with pytest.raises(RuntimeError, match=rf"Hypothesis {hypothesis.__version__} has no .*_get_local_constants"):
        with no_local_constants():
            pass
    assert not hasattr(providers, "_get_local_constants")  # nothing swapped on the way out


_CERTIFY = """
import json, sys
if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
    __import__(sys.argv[2])
from specproof.conformance import certify
report = certify("engine", only=("engine.stop",), db="none")
print(json.dumps({"paths": report.path_coverage, "verdict": report.verdict}, sort_keys=True))
"""


@pytest.mark.slow
def test_a_derandomized_certify_draws_the_same_examples_after_importing_local_constants(
    tmp_path: pathlib.Path,
) -> None:
    """Rounds per rollback path (a fingerprint of every drawn example) of two derandomized certify runs,
    one in a process that imported a module of distinctive constants: equal (they differed before)."""
    name = _write_constants_module(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", _CERTIFY, *extra], capture_output=True, text=True, env=env, timeout=300, check=False
        )
        for extra in ([], [str(tmp_path), name])
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    plain, with_constants = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert plain["verdict"] == "pass"
    assert with_constants == plain
