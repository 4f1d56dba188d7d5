"""The batched capability of specproof-engine/1 (docs/protocol.md, Batches) against Python test engines:
an engine without it is unchanged (no ``BatchEngine``, the batch checks skip it saying why), bad
batched input is refused before anything is sent, and a batched engine's bad answers are faults
that name what was wrong.
"""

from __future__ import annotations

import pytest

from _wire_helpers import FAKE, TESTS, certify_engine, start
from specproof.contract import BatchEngine, BatchRequest, DecodeParams, run_batch
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.engine import NgramDrafter
from specproof.wire import EngineProtocolError, EngineRequestError

pytestmark = pytest.mark.slow  # each test starts an engine process

FAKE_BATCH = TESTS / "_wire_fake_batch_engine.py"


def request(name: str, n: int = 3, **kw: object) -> BatchRequest:
    return BatchRequest(request_id=name, prompt=(5, 6), max_new_tokens=n, **kw)  # type: ignore[arg-type]


def test_an_engine_without_the_capability_is_not_a_batch_engine() -> None:
    with start(FAKE, "ok") as engine:
        assert not hasattr(engine, "batch_capabilities") and not isinstance(engine, BatchEngine)
        with pytest.raises(EngineRequestError, match=r"does not batch.*nothing was sent"):
            engine.add_request(request("r0"))
        assert engine.generate([1, 2], 3).tokens == (2, 2, 2)  # the single-request conversation is untouched


def test_an_old_engine_conforms_unchanged_with_batches_asked_for() -> None:
    report = certify_engine(FAKE, "ok", only=("batch.*",), batches=True)
    batch = [r for r in report["results"] if r["invariant"].startswith("batch.")]
    assert batch and {r["status"] for r in batch} == {"skip"}, batch
    assert all("declares no batch_capabilities" in r["detail"] for r in batch), batch
    assert report["verdict"] != "fail"


def test_a_batched_engine_runs_requests_together() -> None:
    with start(FAKE_BATCH, "ok") as engine:
        assert isinstance(engine, BatchEngine)
        caps = engine.batch_capabilities
        assert (caps.max_batch, caps.slots, caps.continuous_arrivals, caps.preemption) == (4, 4, True, ("recompute",))
        assert not caps.per_slot_state and not caps.schedulable
        done = run_batch(engine, [request("a", 2), request("b", 3, drafter=NgramDrafter())], max_steps=10)
        assert {k: g.tokens for k, g in done.items()} == {"a": (6, 6), "b": (6, 6, 6)}
        assert [s.accepted for s in done["b"].steps] == [(6,), (6,), (6,)]
        engine.add_request(request("c", 5))
        engine.step()
        cancelled = engine.abort_request("c")
        assert cancelled.tokens == (6,) and cancelled.stop_reason == "error"
        assert not engine.has_unfinished_requests()


def test_bad_batched_input_is_refused_before_anything_is_sent() -> None:
    with start(FAKE_BATCH, "ok") as engine:
        sent = engine.traffic["bytes_sent"]
        with pytest.raises(InvalidSettingError, match="takes a BatchRequest"):
            engine.add_request({"request_id": "r0"})  # type: ignore[arg-type]
        with pytest.raises(InvalidSettingError, match="preempt mode='snapshot' is not one the engine declares"):
            engine.preempt("r0", mode="snapshot")
        with pytest.raises(InvalidSettingError, match="no request 'ghost' in the engine"):
            engine.abort_request("ghost")
        with pytest.raises(InvalidSettingError, match=r"step\(only=...\) needs batch.schedulable"):
            engine.step(only=["r0"])
        assert engine.traffic["bytes_sent"] == sent
        engine.add_request(request("r0"))
        with pytest.raises(InvalidSettingError, match="'r0' is already in the engine"):
            engine.add_request(request("r0"))
        with pytest.raises(InvalidSettingError, match="request_id of 300 characters: at most 256 travel"):
            engine.add_request(request("x" * 300))
        # decode parameters do not travel on add_request: refused by name, never dropped (parameter parity)
        with pytest.raises(UnsupportedParameterError, match=r"carries no decode parameters.*\(penalties\)"):
            engine.add_request(request("r1", decode=DecodeParams(frequency_penalty=0.5)))
        with pytest.raises(UnsupportedParameterError, match=r"carries no decode parameters.*eos_token_ids"):
            engine.add_request(request("r2", decode=DecodeParams(eos_token_ids=[3])))
        engine.add_request(request("r3", decode=DecodeParams()))  # all off: nothing to carry


@pytest.mark.parametrize(
    ("mode", "names"),
    [
        ("unknown-request", "an output for 'ghost', which is not a request in this step"),
        ("not-prefix", "'r0' emitted \\[7\\], not a prefix of its accepted tokens \\[6\\]"),
        ("finished-mismatch", "'r0' finished with tokens \\[6, 9\\], but its steps emitted \\[6\\]"),
        ("propose-unknown", "a propose that names 'nobody', which is not a request in this step"),
        ("twice", "two outputs for one request"),
    ],
)
def test_a_bad_batched_answer_is_a_fault_naming_it(mode: str, names: str) -> None:
    with start(FAKE_BATCH, mode, timeout=10.0) as engine:
        engine.add_request(request("r0", 1 if mode == "finished-mismatch" else 5))
        with pytest.raises(EngineProtocolError, match=names):
            engine.step()


def test_a_batched_handshake_without_its_batch_object_is_refused() -> None:
    with pytest.raises(EngineProtocolError, match="capability 'batched' but no 'batch' object"):
        start(FAKE_BATCH, "no-batch-object", timeout=10.0)
