"""Meta-tests: certification rejects every member of the zoo, naming the invariant it breaks.

Each member is certified through the public paths (``specproof.conformance.certify``,
the in-process runner behind ``specproof certify``; one test goes through the CLI
itself) with ``--only <its invariant>`` and the ``quick`` profile to stay fast. The
correct control of each family (the same code without the bug) is accepted, so a
member's rejection is due to its one change; one member is certified without
``--only`` to show the bug is caught by a full run and by nothing outside its
documented invariants.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
from typing import Any

import attrs
import pytest

from _shared_runs import SharedRuns
from specproof.cli import build_parser, main
from specproof.conformance import REGISTRY, certify
from specproof.conformance._options import plan_arguments
from specproof.conformance.zoo import (
    CONTROLS,
    CORRECT,
    CORRECT_DRAFTERS,
    NEEDS_DECODE_STATE,
    ZOO,
    ZooEngine,
    ZooRegistryError,
    build_zoo,
)
from specproof.engine import SpecproofError
from specproof.plugins import resolve_plugin

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`


SAMPLING = "temperature=0.8,top_p=0.95"  # the parameters the sampling members are certified at


def _options(
    kind: str, spec: str, *, only: tuple[str, ...] = (), seed: int | None = None, profile: str = "quick"
) -> dict[str, Any]:
    """``certify``'s options (by dest) for this subject and these checks: the flags their drivers need."""
    sampling = (
        SAMPLING if any(inv.driver in ("sampling", "tree-sampling") for inv in REGISTRY if inv.id in only) else None
    )
    batches = any(inv.driver == "batch-schedules" for inv in REGISTRY if inv.id in only)
    trees = any(inv.driver in ("tree-cases", "tree-sampling") for inv in REGISTRY if inv.id in only)
    decode_state = any(inv.driver == "decode-state" for inv in REGISTRY if inv.id in only)
    decode_state = decode_state or spec.rpartition(":")[2] in NEEDS_DECODE_STATE  # found with decode draws only
    return {
        kind: spec,
        "profile": profile,
        "only": only,
        "seed": seed,
        "sampling": sampling,
        "batches": batches,
        "decode_state": decode_state,
        "trees": trees,
    }


def _certify(
    kind: str,
    spec: str,
    *,
    only: tuple[str, ...] = (),
    seed: int | None = None,
    profile: str = "quick",
    shared: SharedRuns | None = None,
) -> dict[str, Any]:
    """The run's report; through ``shared`` where other tests (test_drafter_reach.py) read the same run."""
    run = certify if shared is None else shared.certify
    return run(kind, **_options(kind, spec, only=only, seed=seed, profile=profile)).to_json()


# a seed whose random quick search finds each member that derandomized quick is not promised to find
SEARCH_SEEDS: dict[str, int] = {}  # member -> a seed whose randomized quick search finds it


def _failing(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in report["results"]:
        if r["status"] in ("fail", "error"):
            out.setdefault(r["invariant"], []).append(r)
    return out


# ------------------------------------------------------------------------------- the registry

IDS = {inv.id for inv in REGISTRY}


def test_every_invariant_has_a_zoo_member_it_rejects() -> None:
    """Each registered invariant claims at least one member (``Invariant.zoo``) that it alone or first rejects."""
    claimed = {inv.id: [m for m in ZOO.values() if m.invariant == inv.id] for inv in REGISTRY}
    assert [i for i, members in claimed.items() if not members] == []
    assert set(ZOO) == {name for inv in REGISTRY for name in inv.zoo}


def test_zoo_and_registry_disagreeing_is_an_error() -> None:
    """A member no invariant claims, a claim on a member the zoo lacks, or a double claim: a clear error."""
    members = {"a": ("engine", ZooEngine), "b": ("engine", ZooEngine)}
    first = attrs.evolve(REGISTRY[0], zoo=("a",), also=())
    with pytest.raises(ZooRegistryError, match=r"\['b'\] are claimed by no invariant"):
        build_zoo(members, [first])
    with pytest.raises(ZooRegistryError, match=rf"{re.escape(first.id)} names zoo member 'c'"):
        build_zoo(members, [attrs.evolve(first, zoo=("a", "b"), also=("c",))])
    with pytest.raises(ZooRegistryError, match="claimed by both"):
        build_zoo(members, [attrs.evolve(first, zoo=("a", "b")), attrs.evolve(REGISTRY[1], zoo=("a",))])
    # the accepting case: every member claimed once, alternates from `also`
    zoo = build_zoo(members, [attrs.evolve(first, zoo=("a",)), attrs.evolve(REGISTRY[1], zoo=("b",), also=("a",))])
    assert (zoo["a"].invariant, zoo["a"].also) == (first.id, (REGISTRY[1].id,))


def test_registry_lists_every_member_with_a_catalogued_invariant() -> None:
    assert len(ZOO) >= 12
    for name, member in ZOO.items():
        kind, invariant, description, spec = member  # unpacks as the brief's tuple
        assert spec == f"specproof.conformance.zoo:{name}"
        assert invariant in IDS and all(alt in IDS for alt in member.also)
        assert invariant not in member.also
        assert description and "\n" not in description
        assert member.cli_args() == [kind, f"--{kind}", spec]


@pytest.mark.parametrize("name", sorted(ZOO))
def test_member_spec_is_a_factory_of_its_implementation(name: str) -> None:
    member = ZOO[name]
    first = resolve_plugin(member.spec, kind=member.kind)
    second = resolve_plugin(member.spec, kind=member.kind)
    assert type(first) is member.implementation
    assert first is not second  # a factory: certification gets fresh instances


def test_oracle_schedule_reaches_every_rollback_path() -> None:
    """The zoo engines' internal drafts give full, rejected-at-0, partial and empty rounds in one generation."""
    gen = ZooEngine(k=4).generate([3, 1, 4, 1, 5], 30)
    assert gen.steps is not None
    kinds = []
    for step in gen.steps:
        j = len(step.accepted) - 1
        kinds.append("empty" if not step.draft else "full" if j == len(step.draft) else "zero" if j == 0 else "partial")
    assert {"full", "zero", "partial", "empty"} <= set(kinds)
    assert any(a == "full" and b == "empty" for a, b in itertools.pairwise(kinds))  # the vLLM case


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ZooEngine(k=0), "k=0"),
        (lambda: ZooEngine(rollback="undo"), "rollback='undo'"),
        (lambda: ZooEngine().generate([], 4), "prompt is empty"),
        (lambda: ZooEngine().generate([1, 64], 4), "prompt[1]=64"),
        (lambda: ZooEngine().generate([1], -1), "max_new_tokens=-1"),
        (lambda: ZooEngine().generate([1], 4, eos_token_id=64), "eos_token_id=64"),
    ],
)
def test_zoo_engine_rejects_bad_settings_clearly(make: Any, message: str) -> None:
    with pytest.raises(SpecproofError, match=re.escape(message)):
        make()


# ------------------------------------------------------------------------------- rejection


_DRIVER = {inv.id: inv.driver for inv in REGISTRY}
_CLI_DEFAULTS = plan_arguments(vars(build_parser().parse_args(["certify"])))


# members whose run takes tens of seconds: the command of another member of their shape, whose run takes a
# second or two, is the one pasted (their own command is still parsed into the very run they are rejected by)
_LONG_RUNS = frozenset(
    {"batch_grammar_rollback_wrong_request", "drafter_ignores_rng", "matches_argmax_at_last_position"}
)


def _pasted() -> set[str]:
    """The members whose reproduce command is run through the CLI too: the first of each shape of
    command (its driver, subject kind and profile), a long run last, and every member whose command
    replays a file its driver wrote (``--replay-session``), which the run's own arguments do not cover."""
    first: dict[tuple[str, str, str], str] = {}
    for name in sorted(ZOO, key=lambda name: (name in _LONG_RUNS, name)):
        member = ZOO[name]
        first.setdefault((_DRIVER[member.invariant], member.kind, member.found_by), name)
    replayed = {name for name, member in ZOO.items() if _DRIVER[member.invariant] == "session-machine"}
    return set(first.values()) | replayed


_PASTED = _pasted()


def test_every_shape_of_command_is_pasted_and_no_long_run_is() -> None:
    assert _LONG_RUNS <= set(ZOO) and not _LONG_RUNS & _PASTED
    shapes = {(_DRIVER[member.invariant], member.kind, member.found_by) for member in ZOO.values()}
    assert shapes == {(_DRIVER[ZOO[name].invariant], ZOO[name].kind, ZOO[name].found_by) for name in _PASTED}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_certify_rejects_member(name: str, shared_runs: SharedRuns) -> None:
    member = ZOO[name]
    seed = SEARCH_SEEDS[name] if member.found_by == "search" else None
    profile = "ci" if member.found_by == "ci" else "quick"
    only = (member.invariant,)
    report = _certify(member.kind, member.spec, only=only, seed=seed, profile=profile, shared=shared_runs)
    assert report["verdict"] == "fail", report["results"]
    failing = _failing(report)
    assert member.invariant in failing, sorted(failing)
    for result in failing[member.invariant]:
        # a violation found, never a crash of the suite: an `error` is not a rejection (a random
        # drafter whose shrunk example passes on replay is reported as a `fail` marked "flaky")
        assert result["status"] == "fail", result["detail"]
        assert result["violations"], result
        assert all(v["invariant"] == member.invariant for v in result["violations"])
        assert f"--only {member.invariant}" in result["reproduce"] and member.spec in result["reproduce"]
    # the printed reproduce command is this very run: `specproof certify` parses it into the plan
    # arguments the run was made with (a pure function of them: the profiles are derandomized)
    command = shlex.split(failing[member.invariant][0]["reproduce"])
    assert command[:2] == ["specproof", "certify"]
    asked = {"subject": member.kind, **_options(member.kind, member.spec, only=only, seed=seed, profile=profile)}
    parsed = plan_arguments(vars(build_parser().parse_args(command[1:])))
    if _DRIVER[member.invariant] == "session-machine":
        # the session's history: the run drew it, the command replays it (and is run below)
        assert parsed["replay_session"]
        parsed["replay_session"] = None
    assert parsed == {**_CLI_DEFAULTS, **plan_arguments(asked)}
    if name in _PASTED:  # and it fails again, the same way, when a user pastes it
        assert main(command[1:]) == 1


@pytest.mark.parametrize("kind", sorted(CONTROLS))
def test_certify_accepts_the_control(kind: str) -> None:
    """The members' code without the bug passes, so each rejection is due to the one change."""
    report = _certify(kind, CONTROLS[kind], only=("drafter.*", "target.*", "engine.*", "trace.*"))
    assert report["verdict"] == "pass", _failing(report)
    checked = {r["invariant"] for r in report["results"] if r["status"] == "pass"}
    assert {"engine.lossless", "engine.state-restored", "engine.kv-length", "engine.accept-rule"} <= checked
    assert any(i.startswith(f"{kind}.") for i in checked)


# ------------------------------------------------------------------------------- one full run, through the CLI


def test_full_run_catches_a_member_without_only(tmp_path: Any) -> None:
    """No ``--only``: every engine invariant runs; the failures are the member's documented ones, nothing else."""
    member = ZOO["forgets_recurrent_restore"]
    out = tmp_path / "report.json"
    code = main(["certify", *member.cli_args(), "--profile", "quick", "--report", str(out)])
    assert code == 1
    report = json.loads(out.read_text())
    assert report["verdict"] == "fail"
    failing = _failing(report)
    assert member.invariant in failing
    assert set(failing) <= set(member.caught_by), sorted(failing)
    ran = {r["invariant"] for r in report["results"]}
    assert {"engine.lossless", "engine.accept-bounds", "engine.kv-length", "engine.stop", "engine.cost"} <= ran


class _ResetKeepsCount:
    """Deterministic from fresh, but ``reset()`` forgets nothing: drafts depend on every earlier call."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, context: object, k: int) -> list[int]:
        self.calls += 1
        return [self.calls % 7][:k]

    def reset(self) -> None:
        pass


def test_deterministic_check_catches_a_reset_that_keeps_state() -> None:
    from specproof.conformance import get
    from specproof.conformance.checks.drafter import check_deterministic

    found, compared = check_deterministic(
        get("drafter.deterministic"), _ResetKeepsCount, [1, 2, 3, 1, 2, 3], [1, 2], other=[4, 5, 6]
    )
    assert compared > 0 and len(found) == 1
    assert found[0].invariant == "drafter.deterministic"
    assert "called at every position" in found[0].explanation


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_certify_accepts_correct_but_different_engines(name: str, shared_runs: SharedRuns) -> None:
    """Engines that expose only an oracle, only greedy(), a same-model copy, or vary k: PASS, not failed."""
    report = _certify("engine", CORRECT[name], shared=shared_runs)  # test_drafts_used.py reads one too
    assert report["verdict"] == "pass", _failing(report)
    passed = {r["invariant"] for r in report["results"] if r["status"] == "pass"}
    assert {"engine.lossless", "engine.stop"} <= passed
    if name == "own_copy_engine":
        (engine,) = report["subjects"]["engines"]
        assert any("oracle" in note for note in engine["notes"])  # the certificate says what it did


@pytest.mark.parametrize("name", sorted(CORRECT_DRAFTERS))
def test_certify_accepts_correct_model_drafters(name: str, shared_runs: SharedRuns) -> None:
    """Draft-model drafters with checkpoint, replay or no rollback at all: PASS on the drafter checks."""
    report = _certify("drafter", CORRECT_DRAFTERS[name], only=("drafter.*",), shared=shared_runs)
    assert report["verdict"] == "pass", _failing(report)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_engines_pass_at_ci_too(name: str) -> None:
    report = certify("engine", engine=CORRECT[name], profile="ci")
    assert report.verdict == "pass", _failing(report.to_json())


def test_suite_drives_a_plugin_engine_down_every_path() -> None:
    """An engine taking the suite's drafter shows every rollback path in its certificate, on a random target."""
    report = _certify("engine", "specproof.conformance.zoo:zoo_engine")
    (coverage,) = report["path_coverage"].values()
    assert coverage["completed"] == coverage["generations"] > 0
    for path in ("all_accepted", "partial", "rejected_at_0", "empty_draft", "empty_after_full", "eos_in_accepted"):
        assert coverage[path] > 0, (path, coverage)
