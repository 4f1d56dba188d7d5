"""Engines judged on what they were sent: ``engine.drafts-used``, own-draft engines, hostile drafts, the domain.

- ``check_drafts_used`` rejects an engine that ignores the suite's drafts or verifies its
  own, and accepts one that cuts an over-long draft to k, varies k, or cuts before an
  out-of-range token (docs/contract.md, "Engines");
- an engine without ``suite_drafts`` is judged on its own drafts: no failure for the
  capability it lacks, ``engine.drafts-used`` skipped with the reason, and INCONCLUSIVE
  when its drafts never reach a rollback path;
- the hostile-drafter rule: an engine that trusts an over-long draft and emits past
  ``max_new_tokens`` fails; one that cuts it, or refuses it, passes;
- ``max_new_tokens = 0`` is drawn, and an engine that refuses it fails with a message
  pointing at the contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from _shared_runs import SharedRuns
from specproof.conformance import _registry as registry
from specproof.conformance import certify
from specproof.conformance._engine_runs import RunCache, run_plugin
from specproof.conformance._probes import HostileDrafter
from specproof.conformance._records import Proposal
from specproof.conformance._subjects import Suite
from specproof.conformance.checks.drafts import check_drafts_used
from specproof.conformance.zoo import ZooEngine, small_reference
from specproof.contract import Step
from specproof.contract.errors import InvalidSettingError
from specproof.engine import greedy_decode
from specproof.strategies import PlannedRound, RoundPlan, ScriptedDrafter


def _step(base: int, draft: list[int], accepted: list[int]) -> Step:
    argmax = [*accepted[:-1], accepted[-1]] + [0] * (len(draft) + 1 - len(accepted))
    return Step(
        base=base, draft=draft, argmax=argmax[: len(draft) + 1], accepted=accepted, processed=base + len(accepted)
    )


def _check(steps: Sequence[Step], proposals: Sequence[Proposal], *, n: int = 20, k: int | None = 4) -> Any:
    inv = registry.get("engine.drafts-used")
    return check_drafts_used(inv, steps, proposals, max_new_tokens=n, k=k, max_context=64, vocab_size=64)


# ------------------------------------------------------------------------------- the check itself


def test_the_draft_sent_is_the_draft_verified() -> None:
    steps = [_step(4, [1, 2, 3], [1, 9]), _step(6, [7], [7, 8])]
    sent = [Proposal(context_length=5, k=3, draft=(1, 2, 3)), Proposal(context_length=7, k=3, draft=(7,))]
    found, compared = _check(steps, sent)
    assert found == [] and compared == 2


def test_an_engine_that_verifies_its_own_draft_is_rejected_with_the_round_and_both_drafts() -> None:
    steps = [_step(4, [1, 2, 3], [1, 9]), _step(6, [5, 5], [5, 8])]
    sent = [Proposal(context_length=5, k=3, draft=(1, 2, 3)), Proposal(context_length=7, k=3, draft=(7, 6))]
    found, compared = _check(steps, sent)
    assert compared == 2 and len(found) == 1
    (v,) = found
    assert v.invariant == "engine.drafts-used" and v.round == 1
    assert "[7, 6]" in v.explanation and "[5, 5]" in v.explanation and v.expected == [7, 6] and v.actual == [5, 5]


def test_an_engine_that_never_asks_is_rejected() -> None:
    steps = [_step(4, [1, 2], [1, 2, 3]), _step(7, [], [4])]
    found, compared = _check(steps, [])
    assert compared == 2
    assert found and "asked for 0 drafts in 2 rounds" in found[0].explanation


def test_a_generation_with_no_room_for_a_draft_needs_no_request() -> None:
    # max_new_tokens = 1: k_eff = 0, so an engine must not ask (docs/contract.md, the decode convention)
    found, compared = _check([_step(4, [], [4])], [], n=1)
    assert found == [] and compared == 0


def test_a_draft_shown_nowhere_is_rejected() -> None:
    steps = [_step(4, [1], [1, 2])]
    found, _ = _check(steps, [Proposal(context_length=9, k=3, draft=(1,))])
    assert found and "asked the suite for no draft at that context" in found[0].explanation


@pytest.mark.parametrize(
    ("reported", "sent", "k"),
    [
        ([1, 2], (1, 2, 3, 4), 2),  # an over-long draft cut to the k asked for
        ([1, 2, 3], (1, 2, 3), 2),  # or verified whole (accept-bounds and stop judge that)
        ([1], (1,), 1),  # k varies per round: 1 here
        ([1, 2], (1, 2, 70, 3), 4),  # cut before an out-of-range id
        ([], (70, 1), 4),  # the out-of-range id is the first: an empty draft
        ([1, 2], tuple(np.array([1, 2], dtype=np.int64)), 4),  # numpy ids are ids
    ],
)
def test_correct_but_different_engines_are_accepted(reported: list[int], sent: tuple[int, ...], k: int) -> None:
    found, compared = _check([_step(4, reported, [*reported, 5])], [Proposal(context_length=5, k=k, draft=sent)])
    assert found == [] and compared == 1


def test_keeping_an_out_of_range_token_or_cutting_an_in_range_draft_is_rejected() -> None:
    kept, _ = _check([_step(4, [1, 70], [1, 5])], [Proposal(context_length=5, k=4, draft=(1, 70))])
    short, _ = _check([_step(4, [1], [1, 5])], [Proposal(context_length=5, k=4, draft=(1, 2))])
    cut_long, _ = _check([_step(4, [1], [1, 5])], [Proposal(context_length=5, k=2, draft=(1, 2, 3))])
    assert kept and short and cut_long
    assert "outside [0, 64)" in kept[0].explanation and "hostile-drafter rule" in kept[0].explanation


# ------------------------------------------------------------------------------- through certify


from _assertions import by_invariant as _results  # noqa: E402


@pytest.mark.parametrize("name", ["zoo_engine", "varying_k_engine"])
def test_engines_that_use_the_suite_drafts_pass_drafts_used(name: str) -> None:
    report = certify(
        "engine", engine=f"specproof.conformance.zoo:{name}", profile="quick", only=("engine.drafts-used",)
    )
    result = _results(report)["engine.drafts-used"]
    assert result["status"] == "pass" and result["exercised"] > 10, result


def test_an_engine_without_suite_drafts_is_judged_on_its_own_drafts(shared_runs: SharedRuns) -> None:
    # the run test_zoo.py accepts the engine with: made once a session
    report = shared_runs.certify("engine", engine="specproof.conformance.zoo:own_drafts_engine", profile="quick")
    assert report.verdict == "pass", [(r["invariant"], r["status"], r["detail"]) for r in report.results]
    results = _results(report)
    assert results["engine.drafts-used"]["status"] == "skip"
    assert "drafted for itself" in results["engine.drafts-used"]["detail"]
    assert results["engine.accept-rule"]["status"] == "pass" and results["engine.accept-rule"]["exercised"] > 0
    (engine,) = report.to_json()["subjects"]["engines"]
    assert engine["capabilities"]["suite_drafts"] is False and engine["capabilities"]["declared"] == ["state"]
    assert report.unreached_paths == {}


class _NeverDraftsOwnEngine(ZooEngine):
    """Correct, drafts for itself with a drafter that never drafts: no rollback path is ever taken."""

    capabilities = frozenset({"state"})

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Any:
        class _Never:
            def propose(self, context: Sequence[int], k: int) -> list[int]:
                return []

        self.drafter = _Never()
        try:
            return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        finally:
            self.drafter = None


def never_drafts_own_engine() -> _NeverDraftsOwnEngine:
    return _NeverDraftsOwnEngine()


def test_an_own_draft_engine_that_never_reaches_a_path_is_inconclusive() -> None:
    report = certify("engine", engine="test_drafts_used:never_drafts_own_engine", profile="quick", only=("engine.*",))
    assert report.verdict == "inconclusive", report.verdict_reason
    assert "partial" in report.verdict_reason and "rejected_at_0" in report.verdict_reason
    assert set(report.unreached_paths["never_drafts_own_engine"]) >= {"all_accepted", "partial", "rejected_at_0"}
    assert not [r for r in report.results if r["status"] in ("fail", "error")]


# ------------------------------------------------------------------------------- hostile drafts


def _verdicts(run: Any) -> dict[str, Any]:
    """Every engine-case invariant's outcome on one run, judged by the registry."""
    return {inv.id: inv.check(None, run) for inv in registry.REGISTRY if inv.driver == "engine-case"}


def _hostile_run(name: str, mode: str) -> Any:
    """One generation of a zoo engine driven by a hostile drafter from its first call on."""
    suite = Suite.from_specs("engine", engine=f"specproof.conformance.zoo:{name}")
    (case,) = suite.engines
    prompt, n, k = [1, 2, 3, 1, 2], 10, 4
    continuation = greedy_decode(small_reference(), prompt, n + k + 2).tokens
    full = PlannedRound(draft_length=k, correct=k)
    scripted = ScriptedDrafter(prompt, continuation[:n], RoundPlan((full,)), vocab_size=case.vocab_size)
    hostile = HostileDrafter(scripted, prompt, continuation, mode=mode, extra=2, start=0, vocab_size=case.vocab_size)
    return run_plugin(
        case,
        prompt=prompt,
        max_new_tokens=n,
        eos=None,
        drafter=hostile,
        drafter_kind="scripted",
        atol=0.0,
        tie_tolerance=0.0,
        horizon=24,
        cache=RunCache(),
        script=f"hostile {mode}",
    )


@pytest.mark.parametrize("mode", HostileDrafter.MODES)
def test_an_engine_that_cuts_a_hostile_draft_passes(mode: str) -> None:
    run = _hostile_run("zoo_engine", mode)
    assert run.completed and run.refused is None
    verdicts = _verdicts(run)
    assert all(not o.violations for o in verdicts.values()), verdicts
    assert verdicts["engine.drafts-used"].exercised > 0


def test_an_engine_that_trusts_an_overlong_draft_emits_past_the_cap_and_fails() -> None:
    run = _hostile_run("trusts_overlong_draft", "overlong")
    assert run.completed
    verdicts = _verdicts(run)
    stop = verdicts["engine.stop"].violations
    assert stop and "max_new_tokens is 10" in stop[0].explanation
    assert verdicts["engine.accept-bounds"].violations  # a draft longer than its k = 4
    assert verdicts["engine.drafts-used"].violations == []  # it verified what it was sent (whole): that rule holds


def test_an_engine_that_refuses_a_hostile_draft_is_not_failed() -> None:
    run = _hostile_run("session_engine", "overlong")  # SpecDecoder inside: it raises on a draft longer than k
    assert run.refused is not None and "refused the hostile draft" in run.refused
    assert "max-length" in run.refused  # the engine's own words are kept


def test_hostile_drafter_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode='huge'"):
        HostileDrafter(
            ScriptedDrafter([1], [2], RoundPlan((PlannedRound(draft_length=1, correct=1),)), vocab_size=64),
            [1],
            [2],
            mode="huge",
            extra=1,
            start=0,
            vocab_size=64,
        )


# ------------------------------------------------------------------------------- max_new_tokens = 0


class _RefusesZeroBudget(ZooEngine):
    """Broken: treats max_new_tokens = 0 as an error, though the contract says it is a valid request."""

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Any:
        if max_new_tokens == 0:
            raise InvalidSettingError("max_new_tokens must be >= 1")
        return super().generate(prompt, max_new_tokens, eos_token_id=eos_token_id)


def refuses_zero_budget() -> _RefusesZeroBudget:
    return _RefusesZeroBudget()


def test_max_new_tokens_zero_is_drawn_and_refusing_it_fails_pointing_at_the_contract() -> None:
    report = certify(
        "engine", engine="test_drafts_used:refuses_zero_budget", profile="quick", only=("engine.lossless",)
    )
    result = _results(report)["engine.lossless"]
    assert result["status"] == "fail", result
    (v,) = result["violations"]
    assert v["example"]["max_new_tokens"] == 0
    assert "max_new_tokens = 0 is a valid request" in v["explanation"] and "docs/contract.md" in v["explanation"]


def test_the_control_answers_max_new_tokens_zero_with_nothing() -> None:
    gen = ZooEngine().generate([1, 2, 3], 0)
    assert list(gen.tokens) == [] and gen.stop_reason == "max_new_tokens" and gen.steps == ()
