"""The ``vllm:`` engine's batch side (``BatchEngine`` over vLLM's request API), without vLLM.

A stand-in ``vllm`` module whose ``LLMEngine`` behaves as vLLM 0.32's does for the adapter (``add_request``
returns an internal id, ``step`` advances every running request one token and returns deltas or cumulative
outputs, at most ``max_num_seqs`` run and the rest wait, ``abort_request`` takes external ids, the scheduler
counts ``num_preemptions``) decodes greedily on the reference, so the adapter's bookkeeping and the suite's
batch checks on a black-box engine run anywhere. tests/frameworks/test_vllm_batches.py holds the real vLLM
to the same.
"""

from __future__ import annotations

import copy
import enum
import itertools
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from specproof.conformance import REGISTRY
from specproof.conformance.checks import batch as checks
from specproof.contract import BatchRequest, run_batch
from specproof.contract.errors import InvalidSettingError
from specproof.engine import greedy_decode
from specproof.engine.adapters import vllm as adapter
from specproof.engine.targets.convert import save_vllm_lfm2
from specproof.fixtures import load_trained_target
from specproof.plugins import load_target
from specproof.strategies import BatchSchedule, PlannedRound, RoundPlan, ScheduledRequest, ScheduleEvent

KIND = enum.Enum("RequestOutputKind", "CUMULATIVE DELTA FINAL_ONLY")
MODEL = load_trained_target()
INV = {inv.id: inv for inv in REGISTRY}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vllm_lfm2(MODEL, str(tmp_path_factory.mktemp("vllm") / "trained"), source="trained")


@attrs.define
class _Held:
    external: str
    tokens: list[int]  # the whole greedy continuation, stop token included
    kind: Any
    emitted: int = 0
    num_preemptions: int = 0


@attrs.define(slots=False)
class FakeLLMEngine:
    """vLLM's ``LLMEngine`` as the adapter uses it; ``corrupt``: a co-batched row's token is off by one (a
    batch-dependent bug); ``preempt_at``: at that step the last running request is preempted (recompute)."""

    max_num_seqs: int = 256
    corrupt: bool = False
    preempt_at: int | None = None
    steps: int = 0
    waiting: dict[str, _Held] = attrs.Factory(dict)
    running: dict[str, _Held] = attrs.Factory(dict)
    ids: Iterator[int] = attrs.Factory(itertools.count)

    def __attrs_post_init__(self) -> None:
        self.vllm_config = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=self.max_num_seqs))
        self.scheduler = types.SimpleNamespace(requests={})
        self.engine_core = types.SimpleNamespace(engine_core=types.SimpleNamespace(scheduler=self.scheduler))

    def add_request(self, request_id: str, prompt: dict[str, Any], params: Any) -> str:
        stop = params.stop_token_ids[0] if params.stop_token_ids else None
        ref = copy.deepcopy(MODEL)
        tokens = list(greedy_decode(ref, prompt["prompt_token_ids"], params.max_tokens, eos_token_id=stop).tokens)
        internal = f"{request_id}-{next(self.ids)}"
        held = _Held(external=request_id, tokens=tokens, kind=params.output_kind)
        self.waiting[internal] = held
        self.scheduler.requests[internal] = held
        return internal

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def abort_request(self, request_ids: Sequence[str]) -> None:
        for pool in (self.waiting, self.running):
            for internal in [i for i, h in pool.items() if h.external in request_ids]:
                del pool[internal]
                del self.scheduler.requests[internal]

    def step(self) -> list[Any]:
        self.steps += 1
        while self.waiting and len(self.running) < self.max_num_seqs:
            internal = next(iter(self.waiting))
            self.running[internal] = self.waiting.pop(internal)
        if self.preempt_at == self.steps and len(self.running) > 1:
            internal = list(self.running)[-1]
            held = self.running.pop(internal)
            held.num_preemptions += 1
            self.waiting[internal] = held
        outs = []
        for row, (internal, held) in enumerate(list(self.running.items())):
            token = held.tokens[held.emitted]
            if self.corrupt and row > 0:
                token = (token + 1) % MODEL.vocab_size
                held.tokens[held.emitted] = token
            held.emitted += 1
            finished = held.emitted == len(held.tokens)
            shown = [token] if held.kind is KIND.DELTA else held.tokens[: held.emitted]
            completion = types.SimpleNamespace(token_ids=shown, spec_decode_metrics=None)
            outs.append(types.SimpleNamespace(request_id=held.external, outputs=[completion], finished=finished))
            if finished:
                del self.running[internal]
                del self.scheduler.requests[internal]
        return outs


@attrs.define
class FakeLLM:
    """``vllm.LLM``: its ``generate`` adds every prompt to its engine and steps to the end, as vLLM's does."""

    llm_engine: FakeLLMEngine
    kwargs: dict[str, Any]
    generate_calls: list[int] = attrs.Factory(list)

    def generate(self, prompts: Sequence[dict[str, Any]], params: Sequence[Any], use_tqdm: bool = False) -> list[Any]:
        self.generate_calls.append(len(prompts))
        ids = [self.llm_engine.add_request(f"g{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params))]
        final: dict[str, Any] = {}
        while self.llm_engine.has_unfinished_requests():
            for out in self.llm_engine.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[f"g{i}"] for i in range(len(ids))]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A stand-in ``vllm`` module; ``options`` are the next ``LLMEngine``'s fields, ``built`` its ``LLM``s."""
    state: dict[str, Any] = {"options": {}, "built": []}
    module = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = KIND  # type: ignore[attr-defined]
    module.inputs = inputs  # type: ignore[attr-defined]
    module.sampling_params = sampling  # type: ignore[attr-defined]
    module.SamplingParams = types.SimpleNamespace  # type: ignore[attr-defined]

    def build(**kwargs: Any) -> FakeLLM:
        llm = FakeLLM(FakeLLMEngine(**state["options"]), kwargs)
        state["built"].append(llm)
        return llm

    module.LLM = build  # type: ignore[attr-defined]
    for name, mod in (("vllm", module), ("vllm.inputs", inputs), ("vllm.sampling_params", sampling)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(adapter, "_LLM", {})
    yield state


def _engine(checkpoint: Path, options: str = "") -> adapter.VLLMEngine:
    spec = f"{checkpoint},oracle=trained:max_context=63" + (f",{options}" if options else "")
    return adapter.VLLMEngine(adapter.parse_vllm_spec(spec), oracle=load_target("trained:max_context=63"))


def _greedy(prompt: Sequence[int], n: int, eos: int | None = None) -> list[int]:
    return list(greedy_decode(copy.deepcopy(MODEL), list(prompt), n, eos_token_id=eos).tokens)


def _subject(engine: adapter.VLLMEngine) -> checks.BatchSubject:
    def make_engine() -> adapter.VLLMEngine:
        engine.reset()  # what certification's plug-in case does for a fresh session
        return engine

    return checks.BatchSubject(
        make_engine=make_engine,
        greedy=_greedy,
        vocab_size=engine.vocab_size,
        k=4,
        capabilities=engine.batch_capabilities,
        tie_tolerance=engine.tie_tolerance,
    )


def _scheduled(prompt: tuple[int, ...], n: int = 6, *, arrival: int = 0) -> ScheduledRequest:
    return ScheduledRequest(prompt=prompt, max_new_tokens=n, plan=RoundPlan((PlannedRound(4, 4),)), arrival=arrival)


# staggered arrivals, a cancellation mid-batch, and an EOS-less request beside a short one
SCHEDULE = BatchSchedule(
    requests=(_scheduled((1, 2, 3)), _scheduled((1, 2, 9, 9), 4, arrival=1), _scheduled((7,), 8, arrival=2)),
    events=(ScheduleEvent(at=3, request=1, action="cancel"),),
)
CHECKS = {
    "batch.isolation": checks.check_isolation,
    "batch.schedule-invariance": checks.check_schedule_invariance,
    "batch.slot-reuse": checks.check_slot_reuse,
    "batch.liveness": checks.check_liveness,
}


def _requests(n: int = 3, new: int = 6) -> list[BatchRequest]:
    return [
        BatchRequest(request_id=f"q{j}", prompt=[(7 * i + 3 * j + 1) % 251 for i in range(5 + j)], max_new_tokens=new)
        for j in range(n)
    ]


def test_the_engine_declares_what_vllm_lets_a_caller_do(checkpoint: Path, fake_vllm: dict[str, Any]) -> None:
    fake_vllm["options"] = {"max_num_seqs": 2}
    caps = _engine(checkpoint, "max_num_seqs=2,block_size=16,kv_blocks=5").batch_capabilities
    assert (caps.max_batch, caps.slots, caps.continuous_arrivals) == (2, 2, True)
    assert caps.preemption == () and not caps.schedulable and not caps.per_slot_state
    assert not caps.batch_invariant_seeding
    (llm,) = fake_vllm["built"]
    assert llm.kwargs["max_num_seqs"] == 2 and llm.kwargs["block_size"] == 16
    assert llm.kwargs["num_gpu_blocks_override"] == 5


@pytest.mark.parametrize("invariant", sorted(CHECKS))
def test_the_suites_batch_checks_pass_and_exercise_a_correct_black_box(
    checkpoint: Path, fake_vllm: dict[str, Any], invariant: str
) -> None:
    fake_vllm["options"] = {"max_num_seqs": 2}  # the third request waits for a free row
    violations, exercised, note = CHECKS[invariant](INV[invariant], _subject(_engine(checkpoint)), SCHEDULE)
    assert violations == [] and exercised > 0, note


def test_a_batch_dependent_bug_is_rejected_on_a_black_box(checkpoint: Path, fake_vllm: dict[str, Any]) -> None:
    """The meta-test of counting a black box's co-batched requests by the tokens it emitted (vLLM reports
    no rounds): a row corrupted only beside another is found, and counted as exercised."""
    fake_vllm["options"] = {"corrupt": True}
    violations, exercised, _ = checks.check_isolation(INV["batch.isolation"], _subject(_engine(checkpoint)), SCHEDULE)
    assert violations and exercised > 0
    assert "differs from its solo run" in violations[0].explanation


def test_staggered_arrivals_give_each_request_its_solo_run(checkpoint: Path, fake_vllm: dict[str, Any]) -> None:
    fake_vllm["options"] = {"preempt_at": 3}
    engine = _engine(checkpoint)
    first, *rest = _requests()
    engine.add_request(first)
    got: dict[str, list[int]] = {first.request_id: []}
    done = {}
    for index in range(40):
        if index == 2:
            for request in rest:
                engine.add_request(request)
                got[request.request_id] = []
        if index > 2 and not engine.has_unfinished_requests():
            break
        for out in engine.step():
            got[out.request_id] += out.new_tokens
            if out.finished is not None:
                done[out.request_id] = out.finished
    assert engine.preemptions == 1  # read off vLLM's scheduler
    for request in _requests():
        assert list(done[request.request_id].tokens) == got[request.request_id] == _greedy(request.prompt, 6)


def test_many_prompts_go_in_one_generate_call(checkpoint: Path, fake_vllm: dict[str, Any]) -> None:
    engine = _engine(checkpoint)
    eos = _greedy(_requests()[1].prompt, 6)[2]
    requests = [*_requests(), BatchRequest(request_id="none", prompt=(3,), max_new_tokens=0)]
    requests[1] = attrs.evolve(requests[1], eos_token_id=eos)
    results = engine.generate_batch(requests)
    (llm,) = fake_vllm["built"]
    assert llm.generate_calls == [3]  # one call, the request asking nothing answered without vLLM
    assert list(results) == [r.request_id for r in requests]
    assert results["q1"].stop_reason == "eos" and results["q1"].tokens[-1] == eos
    assert results["none"].tokens == () and results["none"].stop_reason == "max_new_tokens"
    for request in requests[:3]:
        assert list(results[request.request_id].tokens) == _greedy(request.prompt, 6, request.eos_token_id)
    assert run_batch(engine, requests, max_steps=20) == results  # the step API agrees with the batch call


def test_what_vllm_cannot_do_is_refused_in_one_line(checkpoint: Path, fake_vllm: dict[str, Any]) -> None:
    engine = _engine(checkpoint)
    a, b, _ = _requests()
    engine.add_request(a)
    engine.add_request(b)
    with pytest.raises(InvalidSettingError, match=r"already in the engine"):
        engine.add_request(a)
    with pytest.raises(InvalidSettingError, match=r"cannot leave out \['q1'\].*schedulable=False"):
        engine.step(only=["q0"])
    with pytest.raises(InvalidSettingError, match=r"preempts requests by itself.*kv_blocks="):
        engine.preempt("q0", mode="recompute")
    with pytest.raises(InvalidSettingError, match=r"generate: requests added with add_request are in flight"):
        engine.generate([1, 2], 3)
    outs = engine.step(only=["q0", "q1"])
    assert [o.request_id for o in outs] == ["q0", "q1"] and all(o.step is None for o in outs)
    cancelled = engine.abort_request("q1")
    assert cancelled.stop_reason == "error" and list(cancelled.tokens) == _greedy(b.prompt, 1)
    with pytest.raises(InvalidSettingError, match=r"no request 'q1'"):
        engine.abort_request("q1")
    engine.reset()  # aborts q0 in vLLM too
    assert not engine.has_unfinished_requests() and not engine.llm.llm_engine.has_unfinished_requests()
    assert list(engine.generate([1, 2], 3).tokens) == _greedy([1, 2], 3)


def test_a_request_asking_nothing_finishes_at_the_next_step(checkpoint: Path, fake_vllm: dict[str, Any]) -> None:
    engine = _engine(checkpoint)
    engine.add_request(BatchRequest(request_id="none", prompt=[5, 6], max_new_tokens=0))
    assert engine.has_unfinished_requests()  # vLLM refuses max_tokens=0: the adapter answers it itself
    (out,) = engine.step()
    assert out.finished is not None and out.finished.stop_reason == "max_new_tokens" and out.finished.tokens == ()
    assert not engine.has_unfinished_requests() and not engine.llm.llm_engine.steps
    # a full context leaves room for the one token vLLM samples last: then context_full, as greedy stops
    full = BatchRequest(request_id="full", prompt=[5] * engine.max_context, max_new_tokens=4)
    (out,) = run_batch(engine, [full], max_steps=4).values()
    assert out.stop_reason == "context_full" and list(out.tokens) == _greedy(full.prompt, 1)
