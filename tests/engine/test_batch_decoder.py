"""The batched decoder over the reference slot pool: every request as its solo run, whatever the schedule."""

from __future__ import annotations

import numpy as np
import pytest

from specproof.contract import BatchCapabilities, BatchEngine, BatchRequest, DecodeParams, SamplingParams, run_batch
from specproof.contract.decode_state import plain_decode_with
from specproof.contract.errors import InvalidSettingError, SpecproofError, StaleSnapshotError, TokenRangeError
from specproof.engine import (
    BatchSpecDecoder,
    NgramDrafter,
    ReferenceHybrid,
    ReferenceSlotPool,
    SpecDecoder,
    greedy_decode,
)
from specproof.strategies import PlannedRound, RoundPlan, ScriptedDrafter

TARGET = ReferenceHybrid()
N = 12


def _prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(0, TARGET.vocab_size, size=n))


def _greedy(prompt: tuple[int, ...], n: int = N) -> list[int]:
    return list(greedy_decode(ReferenceHybrid(), prompt, n).tokens)


def _scripted(prompt: tuple[int, ...], *rounds: tuple[int, int]) -> ScriptedDrafter:
    plan = RoundPlan(tuple(PlannedRound(length, correct) for length, correct in rounds))
    return ScriptedDrafter(prompt, _greedy(prompt, N + 8), plan, vocab_size=TARGET.vocab_size)


def _engine(slots: int = 4, **kw: object) -> BatchSpecDecoder:
    return BatchSpecDecoder(ReferenceSlotPool(TARGET, slots=slots), NgramDrafter(), k=4, **kw)  # type: ignore[arg-type]


PLANS = [((4, 4),), ((0, 0),), ((4, 0),), ((4, 2), (0, 0)), ((4, 4), (0, 0)), ((2, 1), (4, 4), (3, 0))]


def _requests(**kw: object) -> list[BatchRequest]:
    out = []
    for i, plan in enumerate(PLANS):
        prompt = _prompt(i, 3 + 2 * i)
        out.append(
            BatchRequest(request_id=f"r{i}", prompt=prompt, max_new_tokens=N, drafter=_scripted(prompt, *plan), **kw)  # type: ignore[arg-type]
        )
    return out


def test_the_engine_declares_every_batch_capability() -> None:
    engine = _engine(slots=3, max_batch=2)
    assert isinstance(engine, BatchEngine)
    assert engine.batch_capabilities == BatchCapabilities(
        max_batch=2,
        slots=3,
        continuous_arrivals=True,
        preemption=("snapshot", "recompute"),
        schedulable=True,
        per_slot_state=True,
        batch_invariant_seeding=True,
    )


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_uneven_rows_in_one_step_each_equal_plain_greedy(rollback: str) -> None:
    engine = _engine(slots=len(PLANS), rollback=rollback)
    requests = _requests()
    widths = []
    for r in requests:
        engine.add_request(r)
    done = {}
    while engine.has_unfinished_requests():
        outs = engine.step()
        widths.append(sorted(len(o.step.draft) for o in outs if o.step is not None))
        done.update({o.request_id: o.finished for o in outs if o.finished is not None})
    # rows of different draft lengths (0 and 4 among them) shared verify steps
    assert any(w[0] == 0 and w[-1] == 4 for w in widths)
    for r in requests:
        assert list(done[r.request_id].tokens) == _greedy(r.prompt), r.request_id


def test_the_step_records_equal_the_solo_decoders() -> None:
    requests = _requests()
    done = run_batch(_engine(slots=2, max_batch=2), requests, max_steps=200)
    for r in _requests():  # fresh scripted drafters for the solo runs
        solo = SpecDecoder(ReferenceHybrid(), r.drafter, k=4).generate(r.prompt, N)  # type: ignore[arg-type]
        assert done[r.request_id].tokens == solo.tokens
        assert done[r.request_id].steps == solo.steps


def test_a_request_arriving_while_others_run_joins_the_batch() -> None:
    engine = _engine(slots=4)
    first, second, third = _requests()[:3]
    engine.add_request(first)
    engine.step()
    engine.step()
    engine.add_request(second)
    outs = engine.step()
    assert {o.request_id for o in outs} == {first.request_id, second.request_id}
    engine.add_request(third)
    done = run_batch(engine, [], max_steps=100)
    done.update({o.request_id: o.finished for o in outs if o.finished is not None})
    for r in (second, third):
        assert list(done[r.request_id].tokens) == _greedy(r.prompt)


def test_a_cancelled_request_frees_its_slot_and_keeps_its_prefix() -> None:
    engine = _engine(slots=2)
    a, b, c = _requests()[:3]
    engine.add_request(a)
    engine.add_request(b)
    engine.step()
    partial = engine.abort_request(a.request_id)
    assert partial.stop_reason == "error"
    assert list(partial.tokens) == _greedy(a.prompt)[: len(partial.tokens)]
    done = run_batch(engine, [c], max_steps=100)  # c takes a's freed slot while b is mid-flight
    assert list(done[b.request_id].tokens) == _greedy(b.prompt)
    assert list(done[c.request_id].tokens) == _greedy(c.prompt)


def test_eos_in_the_middle_of_one_rows_block_stops_only_that_row() -> None:
    requests = _requests()
    target_row = requests[0]  # all accepted: 5 tokens a round
    eos = _greedy(target_row.prompt)[2]
    requests[0] = BatchRequest(
        request_id="eos", prompt=target_row.prompt, max_new_tokens=N, eos_token_id=eos, drafter=target_row.drafter
    )
    done = run_batch(_engine(slots=len(requests)), requests, max_steps=200)
    expected = greedy_decode(ReferenceHybrid(), target_row.prompt, N, eos_token_id=eos)
    assert done["eos"].tokens == expected.tokens and done["eos"].stop_reason == "eos"
    for r in requests[1:]:
        assert list(done[r.request_id].tokens) == _greedy(r.prompt)


@pytest.mark.parametrize("mode", ["snapshot", "recompute"])
@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_a_preempted_request_resumes_to_its_solo_output(mode: str, rollback: str) -> None:
    engine = _engine(slots=2, rollback=rollback)
    a, b, c = _requests()[3:6]
    engine.add_request(a)
    engine.add_request(b)
    engine.step()
    engine.preempt(a.request_id, mode=mode)
    assert engine.slot_state(a.request_id) is None
    engine.add_request(c)  # c takes a's slot; a waits for one
    outs = engine.step(only=(b.request_id, c.request_id))
    assert a.request_id not in {o.request_id for o in outs}
    done = run_batch(engine, [], max_steps=100)
    for r in (a, b, c):
        assert list(done[r.request_id].tokens) == _greedy(r.prompt), r.request_id


def test_a_freed_slot_is_handed_out_again_and_passes_nothing_on() -> None:
    engine = _engine(slots=1)
    a, b = _requests()[3:5]
    first = run_batch(engine, [a], max_steps=50)
    run_batch(engine, [b], max_steps=50)
    again = attrs_evolve_request(a, "a-again")
    second = run_batch(engine, [again], max_steps=50)
    assert first[a.request_id].tokens == second["a-again"].tokens == tuple(_greedy(a.prompt))


def attrs_evolve_request(request: BatchRequest, request_id: str) -> BatchRequest:
    plan = request.drafter.plan  # type: ignore[union-attr]
    drafter = ScriptedDrafter(request.prompt, _greedy(request.prompt, N + 8), plan, vocab_size=TARGET.vocab_size)
    return BatchRequest(request_id=request_id, prompt=request.prompt, max_new_tokens=N, drafter=drafter)


def test_each_slot_state_equals_a_fresh_target_fed_the_accepted_context() -> None:
    engine = _engine(slots=3)
    for r in _requests()[:3]:
        engine.add_request(r)
    contexts = {r.request_id: list(r.prompt) for r in _requests()[:3]}
    checked = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            contexts[out.request_id].extend(out.new_tokens)
            if out.finished is not None:
                continue
            fresh = ReferenceHybrid()
            fresh.forward(contexts[out.request_id][:-1])
            state = engine.slot_state(out.request_id)
            assert state is not None
            for name, value in fresh.state_arrays().items():
                np.testing.assert_array_equal(state[name], value, err_msg=name)
            checked += 1
    assert checked > 5


def test_seeded_sampled_requests_equal_their_solo_runs_whatever_their_neighbours() -> None:
    params = [SamplingParams(temperature=0.8, seed=s) for s in (1, 2)] + [SamplingParams(temperature=0.8)]
    requests = [
        BatchRequest(request_id=f"s{i}", prompt=_prompt(i, 6), max_new_tokens=N, sampling=p, drafter=NgramDrafter())
        for i, p in enumerate(params)
    ]
    done = run_batch(_engine(slots=3), requests, max_steps=100)
    for r in requests[:2]:
        solo = SpecDecoder(ReferenceHybrid(), NgramDrafter(), k=4).generate(r.prompt, N, sampling=r.sampling)
        assert done[r.request_id].tokens == solo.tokens


def test_generate_is_a_batch_of_one() -> None:
    prompt = _prompt(7, 9)
    assert list(_engine().generate(prompt, N).tokens) == _greedy(prompt)


def test_bad_use_is_a_clear_error() -> None:
    engine = _engine(slots=1)
    with pytest.raises(InvalidSettingError, match="empty"):
        BatchRequest(request_id="x", prompt=(), max_new_tokens=3)
    with pytest.raises(InvalidSettingError, match="max_new_tokens"):
        BatchRequest(request_id="x", prompt=(1,), max_new_tokens=-1)
    engine.add_request(BatchRequest(request_id="x", prompt=(1, 2), max_new_tokens=3))
    with pytest.raises(InvalidSettingError, match="already"):
        engine.add_request(BatchRequest(request_id="x", prompt=(1, 2), max_new_tokens=3))
    with pytest.raises(InvalidSettingError, match="not running"):
        engine.preempt("x", mode="snapshot")
    with pytest.raises(InvalidSettingError, match="mode"):
        engine.preempt("x", mode="swap")
    with pytest.raises(InvalidSettingError, match="no request"):
        engine.step(only=("nope",))
    with pytest.raises(InvalidSettingError, match="rollback"):
        _engine(rollback="rewind")
    with pytest.raises(SpecproofError, match="max_steps"):
        run_batch(_engine(slots=1), [BatchRequest(request_id="y", prompt=(1,), max_new_tokens=50)], max_steps=2)


def test_a_stale_swapped_snapshot_is_refused() -> None:
    pool = ReferenceSlotPool(TARGET, slots=1)
    slot = pool.acquire()
    pool.device(slot).forward([1, 2, 3])
    swapped = pool.evict(slot)
    swapped.device.reset()  # its memory overwritten while swapped out
    swapped.device.forward([4, 5, 6])
    with pytest.raises(StaleSnapshotError):
        pool.resume(swapped)


def test_the_pool_masks_padding_and_writes_none_of_it() -> None:
    pool = ReferenceSlotPool(TARGET, slots=2)
    a, b = pool.acquire(), pool.acquire()
    out = pool.forward_batch([(a, [1, 2, 3]), (b, [4])], checkpoints=True)
    assert out.mask.tolist() == [[True, True, True], [True, False, False]]
    assert pool.device(b).processed == 1 and not out.logits[1, 1:].any()
    solo = ReferenceHybrid()
    np.testing.assert_array_equal(out.row(1), solo.forward([4]))
    assert pool.device(b).snapshot() == out.checkpoints[1][0]  # type: ignore[index]


# ------------------------------------------------------------------ decode parameters per request


def _decoded(prompt: tuple[int, ...], decode: DecodeParams) -> list[int]:
    free = DecodeParams(repetition_penalty=decode.repetition_penalty, logit_bias=dict(decode.logit_bias))
    return list(plain_decode_with(ReferenceHybrid(), prompt, N + 8, decode=free).tokens)


def test_each_batch_request_keeps_its_own_decode_state() -> None:
    """Neighbours with different penalties, a bias, min_tokens and stops in one verify step: each equals plain
    decoding with its own parameters (and a request without any equals plain greedy)."""
    params = [
        DecodeParams(repetition_penalty=2.0, frequency_penalty=0.4),
        None,
        DecodeParams(repetition_penalty=1.3, logit_bias={3: 4.0, 7: -100.0}, min_tokens=4),
        DecodeParams(repetition_penalty=4.0),
    ]
    requests = []
    for i, decode in enumerate(params):
        prompt = _prompt(40 + i, 6)
        source = _greedy(prompt, N + 8) if decode is None else _decoded(prompt, decode)
        if decode is not None and i == 3:
            decode = DecodeParams(repetition_penalty=4.0, stop=[source[5:7]])  # a stop ending mid-output
        plan = RoundPlan((PlannedRound(4, 4), PlannedRound(4, 2), PlannedRound(0, 0)))
        drafter = ScriptedDrafter(prompt, source, plan, vocab_size=TARGET.vocab_size)
        requests.append(
            BatchRequest(request_id=f"r{i}", prompt=prompt, max_new_tokens=N, drafter=drafter, decode=decode)
        )
    results = run_batch(_engine(), requests, max_steps=4 * N)
    for request in requests:
        if request.decode is None:
            assert list(results[request.request_id].tokens) == _greedy(request.prompt)
            continue
        want = plain_decode_with(ReferenceHybrid(), request.prompt, N, decode=request.decode)
        got = results[request.request_id]
        assert (list(got.tokens), got.stop_reason) == (list(want.tokens), want.stop_reason), request.request_id
    assert results["r3"].stop_reason == "stop_sequence"


def test_a_batch_request_with_bad_decode_parameters_is_refused_naming_them() -> None:
    with pytest.raises(InvalidSettingError, match="decode"):
        BatchRequest(request_id="a", prompt=(1, 2), max_new_tokens=2, decode={"min_tokens": 1})  # type: ignore[arg-type]
    big = DecodeParams(logit_bias={TARGET.vocab_size: 1.0})
    with pytest.raises(TokenRangeError, match="logit_bias"):
        _engine().add_request(BatchRequest(request_id="a", prompt=(1, 2), max_new_tokens=2, decode=big))
