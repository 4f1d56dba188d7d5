"""The native C++ engine's batches over specproof-engine/1 (capability batched; docs/protocol.md, Batches):
its slot pool passes the batch checks over ``exec:`` on both rollbacks, its planted slot-reuse bug
(``--bug slot-reuse-stale-state``: a reused slot keeps its last tenant's conv state) is rejected on
``batch.slot-reuse``, rows with uneven drafts each equal their solo greedy run, and bad batched
requests are answered with errors naming the problem, the engine staying usable.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from _assertions import by_invariant
from specproof.conformance import certify
from specproof.contract import BatchRequest, SamplingParams, run_batch
from specproof.engine import NgramDrafter, greedy_decode
from specproof.plugins import load_target
from specproof.strategies import PlannedRound, RoundPlan, ScriptedDrafter
from specproof.wire import EngineRequestError, ExecEngine, TcpEngine

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

PROMPTS = ([72, 101, 108, 108, 111, 32], [84, 104, 101], [1], [97, 98, 99, 97, 98, 99, 97])


@pytest.fixture(scope="module")
def start(native: tuple[Path, Path]) -> Callable[..., ExecEngine]:
    binary, weights = native

    def make(*args: str) -> ExecEngine:
        return ExecEngine([str(binary), "--weights", str(weights), *args], timeout=30.0, load_target=load_target)

    return make


def spec(native: tuple[Path, Path], *args: str) -> str:
    binary, weights = native
    return " ".join(["exec:" + str(binary), "--weights", str(weights), *args])


def batch_results(native: tuple[Path, Path], *args: str) -> dict[str, dict[str, object]]:
    report = certify("engine", engine=spec(native, *args), profile="quick", only=("batch.*",), batches=True)
    return by_invariant(report)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_the_native_slot_pool_passes_the_batch_checks(native: tuple[Path, Path], rollback: str) -> None:
    results = batch_results(native, "--rollback", rollback, "--slots", "3")
    for check in ("batch.isolation", "batch.schedule-invariance", "batch.slot-reuse", "batch.liveness"):
        assert results[check]["status"] == "pass", results[check]
        assert int(results[check]["exercised"]) > 0, results[check]  # type: ignore[call-overload]
    # no slot state travels over the wire: the white-box check says so
    assert results["batch.per-slot-state"]["status"] == "skip"


def test_the_planted_slot_reuse_bug_is_rejected_over_exec(native: tuple[Path, Path]) -> None:
    results = batch_results(native, "--bug", "slot-reuse-stale-state")
    assert results["batch.slot-reuse"]["status"] == "fail", results["batch.slot-reuse"]
    assert results["batch.liveness"]["status"] == "pass"  # the bug corrupts tokens, not the schedule


def test_rows_with_uneven_drafts_each_equal_their_solo_greedy_run(start: Callable[..., ExecEngine]) -> None:
    """Four requests in one batch: one drafts nothing, one all-accepted drafts, one all-rejected, one mixed."""
    model = load_target("trained")
    n = 12
    plans = [
        RoundPlan((PlannedRound(0, 0),)),
        RoundPlan((PlannedRound(4, 4),)),
        RoundPlan((PlannedRound(4, 0),)),
        RoundPlan((PlannedRound(4, 2), PlannedRound(0, 0), PlannedRound(3, 3))),
    ]
    with start("--slots", "4") as engine:
        requests, want = [], {}
        for i, (prompt, plan) in enumerate(zip(PROMPTS, plans, strict=True)):
            full = list(greedy_decode(model, prompt, n + 8).tokens)
            want[f"r{i}"] = tuple(full[:n])
            drafter = ScriptedDrafter(prompt, full, plan, vocab_size=256)
            requests.append(BatchRequest(request_id=f"r{i}", prompt=prompt, max_new_tokens=n, drafter=drafter))
        done = run_batch(engine, requests, max_steps=4 * n)
        assert {k: g.tokens for k, g in done.items()} == want
        assert all(len(s.draft) == 0 for s in done["r0"].steps)  # the zero-draft row beside full ones
        assert any(len(s.draft) == 4 and len(s.accepted) == 1 for s in done["r2"].steps)


def test_bad_batched_requests_get_errors_naming_them(start: Callable[..., ExecEngine]) -> None:
    with start("--slots", "2") as engine:
        with pytest.raises(EngineRequestError, match=r"prompt\[1\]=300 is outside \[0, 256\)"):
            engine.add_request(BatchRequest(request_id="r0", prompt=(5, 300), max_new_tokens=3))
        engine.add_request(BatchRequest(request_id="r0", prompt=(5, 6), max_new_tokens=3))
        with pytest.raises(EngineRequestError, match="request 'r0' is not running"):
            engine.preempt("r0", mode="snapshot")  # queued: it holds no slot yet
        channel = engine._channel  # what a client other than specproof's might send
        rid = channel.new_id()
        channel.send({"type": "step", "id": rid, "only": ["nobody"]}, "raw step")
        answer = channel.receive(("error",), "raw step")
        assert "step.only names 'nobody', which is not a request in the engine" in answer["message"]
        rid = channel.new_id()
        channel.send({"type": "add_request", "id": rid, "request": "r0", "prompt": [1], "max_new_tokens": 1}, "raw")
        assert "request 'r0' is already in the engine" in channel.receive(("error",), "raw")["message"]
        # still usable: r0 runs to the end beside a new request
        engine.add_request(BatchRequest(request_id="r1", prompt=(7,), max_new_tokens=2))
        done = run_batch(engine, [], max_steps=10)
        assert sorted(done) == ["r0", "r1"] and len(done["r0"].tokens) == 3


class _Overlong:
    """A drafter that proposes more tokens than the engine asked for."""

    def propose(self, context: object, k: int) -> list[int]:
        return [1] * (k + 3)


def test_an_error_answering_a_step_drops_every_request_on_both_sides(start: Callable[..., ExecEngine]) -> None:
    with start() as engine:
        engine.add_request(BatchRequest(request_id="ok", prompt=(5, 6), max_new_tokens=8))
        engine.add_request(BatchRequest(request_id="bad", prompt=(5, 6), max_new_tokens=8, drafter=_Overlong()))
        with pytest.raises(EngineRequestError, match="the draft has 7 tokens, more than k=4"):
            engine.step()
        assert not engine.has_unfinished_requests()  # the client reset the engine: nothing half-advanced is left
        done = run_batch(engine, [BatchRequest(request_id="ok", prompt=(5, 6), max_new_tokens=2)], max_steps=5)
        assert list(done) == ["ok"]


class _Raising:
    """A drafter that fails: the suite's own bug, mid-step."""

    def propose(self, context: object, k: int) -> list[int]:
        raise RuntimeError("drafter broke")


def test_a_drafter_raising_mid_step_leaves_no_request_half_advanced(start: Callable[..., ExecEngine]) -> None:
    with start() as engine:
        engine.add_request(BatchRequest(request_id="ok", prompt=(5, 6), max_new_tokens=8))
        engine.add_request(BatchRequest(request_id="bad", prompt=(5, 6), max_new_tokens=8, drafter=_Raising()))
        with pytest.raises(RuntimeError, match="drafter broke"):
            engine.step()
        assert not engine.has_unfinished_requests()
        done = run_batch(engine, [BatchRequest(request_id="ok", prompt=(5, 6), max_new_tokens=2)], max_steps=5)
        assert list(done) == ["ok"] and engine.restarts == 0


def test_batches_over_tcp_and_a_new_connection_starts_with_none(native: tuple[Path, Path]) -> None:
    """Over ``tcp:`` the same batches run; a client that leaves requests in flight and disconnects
    leaves nothing for the next one (every connection starts a new session)."""
    binary, weights = native
    model = load_target("trained")
    proc = subprocess.Popen(
        [binary, "--weights", weights, "--listen", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().rsplit(":", 1)[1])
        with TcpEngine("127.0.0.1", port, timeout=30.0, load_target=load_target) as engine:
            engine.add_request(BatchRequest(request_id="left", prompt=(5, 6), max_new_tokens=30))
            engine.step()
        with TcpEngine("127.0.0.1", port, timeout=30.0, load_target=load_target) as engine:
            requests = [
                BatchRequest(request_id=name, prompt=p, max_new_tokens=6) for name, p in (("left", (5, 6)), ("b", (7,)))
            ]
            done = run_batch(engine, requests, max_steps=20)
            for request in requests:
                want = greedy_decode(model, request.prompt, 6).tokens
                assert done[request.request_id].tokens == want
            engine.shutdown()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_seeded_request_gives_its_solo_output_whatever_its_neighbours(start: Callable[..., ExecEngine]) -> None:
    """``batch_invariant_seeding``: each request samples with its own generator, seeded by its own seed."""
    seeded = SamplingParams(temperature=0.8, seed=3)

    def mine() -> BatchRequest:
        drafter = NgramDrafter()
        return BatchRequest(request_id="me", prompt=PROMPTS[0], max_new_tokens=16, sampling=seeded, drafter=drafter)

    with start() as engine:
        assert engine.batch_capabilities.batch_invariant_seeding
        alone = run_batch(engine, [mine()], max_steps=40)["me"].tokens
        assert alone != greedy_decode(load_target("trained"), PROMPTS[0], 16).tokens  # it did sample
        neighbours = [
            BatchRequest(
                request_id="unseeded", prompt=PROMPTS[1], max_new_tokens=16, sampling=SamplingParams(temperature=0.8)
            ),
            BatchRequest(request_id="greedy", prompt=PROMPTS[3], max_new_tokens=16, drafter=NgramDrafter()),
        ]
        together = run_batch(engine, [*neighbours, mine()], max_steps=40)
        assert together["me"].tokens == alone
