"""Meta-tests of the batch checks: each rejects its zoo member and accepts correct engines that batch
differently; the schedules strategy; how certification runs them (docs/contract.md, "Batches")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given, settings

from _shared_runs import SharedRuns
from specproof.conformance import REGISTRY, certify
from specproof.conformance.checks import batch as checks
from specproof.conformance.zoo import CORRECT_BATCH, ZOO
from specproof.conformance.zoo import _batch_engines as zoo
from specproof.conformance.zoo._targets import small_reference
from specproof.contract.errors import InvalidSettingError
from specproof.engine import greedy_decode
from specproof.strategies import (
    BatchSchedule,
    PlannedRound,
    RoundPlan,
    ScheduledRequest,
    ScheduleEvent,
    batch_schedules,
)
from specproof.strategies._contexts import StrategyArgumentError

MODEL = small_reference()
_GREEDY: dict[tuple[Any, ...], list[int]] = {}


def _greedy(prompt: Sequence[int], n: int, eos: int | None) -> list[int]:
    key = (tuple(prompt), n, eos)
    if key not in _GREEDY:
        _GREEDY[key] = list(greedy_decode(small_reference(), list(prompt), n, eos_token_id=eos).tokens)
    return _GREEDY[key]


def _subject(engine: Callable[[], Any]) -> checks.BatchSubject:
    return checks.BatchSubject(
        make_engine=engine,
        greedy=_greedy,
        vocab_size=MODEL.vocab_size,
        k=4,
        capabilities=engine().batch_capabilities,
        make_reference=small_reference,
    )


def _request(prompt: tuple[int, ...], *rounds: tuple[int, int], arrival: int = 0) -> ScheduledRequest:
    plan = RoundPlan(tuple(PlannedRound(n, c) for n, c in rounds))
    return ScheduledRequest(prompt=prompt, max_new_tokens=10, plan=plan, arrival=arrival)


# a row rejected at 0 ahead of a full-then-empty row and a zero-draft row: uneven rows in every step
MIXED = BatchSchedule(
    requests=(_request((1, 2, 3), (4, 0)), _request((1, 2, 9, 9), (4, 4), (0, 0)), _request((7,), (0, 0)))
)
# a request preempted by snapshot after its first round, beside another
PREEMPTED = BatchSchedule(
    requests=(_request((1, 2, 3), (4, 2)), _request((5, 2, 3), (4, 2))),
    events=(ScheduleEvent(at=1, request=0, action="snapshot"),),
)
CHECKS = {
    "batch.isolation": checks.check_isolation,
    "batch.schedule-invariance": checks.check_schedule_invariance,
    "batch.slot-reuse": checks.check_slot_reuse,
    "batch.per-slot-state": checks.check_per_slot_state,
    "batch.liveness": checks.check_liveness,
}
INV = {inv.id: inv for inv in REGISTRY}
REJECTS = [
    ("batch_pads_recurrent_state", "batch.isolation", MIXED),
    ("batch_rollback_wrong_slot", "batch.isolation", MIXED),
    ("batch_stale_resume", "batch.schedule-invariance", PREEMPTED),
    ("batch_slot_not_cleared", "batch.slot-reuse", MIXED),
    ("batch_stale_zero_draft", "batch.per-slot-state", MIXED),
    ("batch_retries_rejected_row", "batch.liveness", MIXED),
    ("batch_verify_depends_on_batch_size", "batch.isolation", MIXED),
]
CORRECT_ENGINES = [zoo.BatchZooEngine, zoo.BatchReplayEngine, zoo.BatchFifoTwoRows, zoo.BatchRecomputeOnly]


@pytest.mark.parametrize(("member", "invariant", "schedule"), REJECTS, ids=[r[0] for r in REJECTS])
def test_each_batch_check_rejects_its_zoo_member(member: str, invariant: str, schedule: BatchSchedule) -> None:
    assert ZOO[member].invariant == invariant
    violations, exercised, _ = CHECKS[invariant](INV[invariant], _subject(ZOO[member].implementation), schedule)
    assert violations and exercised > 0
    assert all(v.invariant == invariant for v in violations)


@pytest.mark.parametrize("invariant", sorted(CHECKS))
@pytest.mark.parametrize("engine", CORRECT_ENGINES, ids=lambda e: e.__name__)
def test_correct_engines_that_batch_differently_pass_every_check(invariant: str, engine: type) -> None:
    for schedule in (MIXED, PREEMPTED):
        violations, exercised, note = CHECKS[invariant](INV[invariant], _subject(engine), schedule)
        assert violations == [] and exercised > 0, note


def test_a_check_says_when_nothing_reached_it() -> None:
    alone = BatchSchedule(requests=(_request((1, 2), (4, 4)),))
    violations, exercised, note = checks.check_isolation(INV["batch.isolation"], _subject(zoo.BatchZooEngine), alone)
    assert (violations, exercised) == ([], 0) and "in flight together" in note


def test_preemption_in_both_modes_and_a_cancellation_keep_every_output() -> None:
    schedule = BatchSchedule(
        requests=(*MIXED.requests, _request((4, 4, 4), (2, 1), arrival=1)),
        events=(
            ScheduleEvent(at=1, request=0, action="recompute"),
            ScheduleEvent(at=1, request=1, action="snapshot"),
            ScheduleEvent(at=2, request=2, action="cancel"),
        ),
    )
    run = checks.run_schedule(_subject(zoo.BatchReplayEngine), schedule)
    assert run.error is None and len(run.applied) == 3 and set(run.cancelled) == {"r2"}
    violations, exercised, _ = checks.check_schedule_invariance(
        INV["batch.schedule-invariance"], _subject(zoo.BatchReplayEngine), schedule
    )
    assert violations == [] and exercised >= 3


@settings(max_examples=30)
@given(batch_schedules(vocab_size=MODEL.vocab_size, k=4, max_requests=3, max_new_tokens=6, max_prompt=5))
def test_schedules_stay_within_their_bounds(schedule: BatchSchedule) -> None:
    assert 1 <= len(schedule.requests) <= 3
    for r in schedule.requests:
        assert 1 <= len(r.prompt) <= 5 and 1 <= r.max_new_tokens <= 6 and r.seed is None
        assert r.eos_at is None or r.eos_at < r.max_new_tokens
    for e in schedule.events:
        assert e.action in ("snapshot", "recompute", "cancel") and 0 <= e.request < len(schedule.requests)


def test_bad_schedule_arguments_are_clear_errors() -> None:
    with pytest.raises(StrategyArgumentError, match="max_requests"):
        batch_schedules(vocab_size=8, k=2, max_requests=0)
    with pytest.raises(StrategyArgumentError, match="vocab_size"):
        batch_schedules(vocab_size=1, k=2)


# ------------------------------------------------------------------ through certification


def _statuses(report: Any) -> dict[str, tuple[str, str]]:
    return {r["id"]: (r["status"], r.get("detail") or "") for r in report.to_json()["results"]}


@pytest.mark.slow
def test_the_batch_checks_run_only_when_asked() -> None:
    statuses = _statuses(certify(only=("batch.liveness",)))
    assert {s for s, _ in statuses.values()} == {"skip"}
    assert all("--batches" in detail for _, detail in statuses.values())


@pytest.mark.slow
def test_an_engine_that_does_not_batch_is_skipped_saying_why() -> None:
    report = certify("engine", engine="specproof.conformance.zoo:zoo_engine", only=("batch.isolation",), batches=True)
    [(status, detail)] = _statuses(report).values()
    assert status == "skip" and "batch_capabilities" in detail


class _GreedyOnlyBatchEngine(zoo.BatchZooEngine):
    """A batched engine that decodes greedily only (as the llamacpp: batch engine): it refuses a sampled request."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_capabilities = attrs.evolve(self.batch_capabilities, sampling=False)

    def add_request(self, request: Any) -> None:
        if request.sampling is not None and not request.sampling.greedy:
            raise InvalidSettingError(f"request {request.request_id!r} samples: this engine decodes greedily only")
        super().add_request(request)


def greedy_only_batch_engine() -> _GreedyOnlyBatchEngine:
    return _GreedyOnlyBatchEngine()


@pytest.mark.slow
def test_a_greedy_only_batch_engine_skips_the_sampling_batch_checks_saying_why() -> None:
    # a refusal the engine declared (sampling=False) is a skip with its reason; the greedy checks still run
    spec = "test_batch_checks:greedy_only_batch_engine"
    only = ("batch.seeds", "batch.sampled-distribution", "batch.isolation")
    report = certify("engine", engine=spec, only=only, batches=True).to_json()
    statuses = {r["invariant"]: (r["status"], r.get("detail") or "") for r in report["results"]}
    assert statuses["batch.isolation"][0] == "pass"
    for invariant in ("batch.seeds", "batch.sampled-distribution"):
        status, detail = statuses[invariant]
        assert status == "skip" and "greedily only" in detail, (invariant, status, detail)


@pytest.mark.slow
def test_the_builtin_stack_passes_the_batch_checks_with_counts() -> None:
    report = certify(only=("batch.*",), batches=True).to_json()
    rows = [r for r in report["results"] if r["invariant"].startswith("batch.")]
    assert len(rows) == 18 and all(r["status"] == "pass" and r["exercised"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in ZOO if n.startswith("batch_")))
def test_every_batch_zoo_member_is_rejected_at_quick_on_its_id(name: str, shared_runs: SharedRuns) -> None:
    member = ZOO[name]
    # the very run test_zoo.py rejects the member with: made once a session
    report = shared_runs.certify("engine", engine=member.spec, only=(member.invariant,), batches=True).to_json()
    assert [r["status"] for r in report["results"]] == ["fail"], report["results"]


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["quick", "ci"])
@pytest.mark.parametrize("name", sorted(CORRECT_BATCH))
def test_correct_batch_engines_are_accepted(name: str, profile: str, shared_runs: SharedRuns) -> None:
    # test_batch_distribution.py reads this run's batch.sampled-distribution row: made once a session
    report = shared_runs.certify(
        "engine", engine=CORRECT_BATCH[name], only=("batch.*",), batches=True, profile=profile
    ).to_json()
    statuses = {r["invariant"]: r["status"] for r in report["results"]}
    assert len(statuses) == 9 and set(statuses.values()) == {"pass"}, report["results"]
    assert all(r["exercised"] > 0 for r in report["results"])


@pytest.mark.slow
def test_with_decode_state_every_batch_check_draws_decode_parameters_and_the_builtin_passes() -> None:
    """``--batches --decode-state``: a schedule's requests carry their own processors, min_tokens and stops in
    every batch check, each judged against plain decoding with its own; the built-in stack passes them all."""
    report = certify(only=("batch.*",), batches=True, decode_state=True).to_json()
    rows = [r for r in report["results"] if r["invariant"].startswith("batch.")]
    assert len(rows) == 18
    # the greedy checks judge every request with decode parameters exactly; the sampled ones (their own
    # requests, unseeded neighbours' entropy) are held by their own tests and must not fail here
    sampled = {"batch.seeds", "batch.sampled-distribution"}
    exact = [(r["id"], r["status"], r["exercised"]) for r in rows if r["invariant"] not in sampled]
    assert all(status == "pass" and exercised > 0 for _, status, exercised in exact), exact
    assert all(r["status"] != "fail" for r in rows if r["invariant"] in sampled), rows
