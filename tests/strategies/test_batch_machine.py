"""BatchMachine: passes on the built-in batched decoder (both rollbacks, two rows a step, recompute-only
preemption) and rejects batch zoo members, shrinking to the calls that break them; configure() errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from specproof.conformance.zoo import _batch_engines as zoo
from specproof.conformance.zoo._targets import small_reference
from specproof.contract.errors import InvalidSettingError
from specproof.engine import BatchSpecDecoder, NgramDrafter, ReferenceSlotPool, greedy_decode
from specproof.strategies import BatchMachine, BatchMachineFailure
from specproof.strategies._contexts import StrategyArgumentError

MODEL = small_reference()
_GREEDY: dict[tuple[Any, ...], list[int]] = {}


def plain_greedy(prompt: Sequence[int], n: int, eos: int | None) -> list[int]:
    """The judge: plain greedy on a fresh copy of the model (no speculative code)."""
    key = (tuple(prompt), n, eos)
    if key not in _GREEDY:
        _GREEDY[key] = list(greedy_decode(small_reference(), list(prompt), n, eos_token_id=eos).tokens)
    return _GREEDY[key]


def _builtin() -> BatchSpecDecoder:
    return BatchSpecDecoder(ReferenceSlotPool(small_reference(), slots=2), NgramDrafter(), k=4, rollback="replay")


def _machine(engine: Any) -> type[BatchMachine]:
    return BatchMachine.configure(engine_factory=engine, greedy=plain_greedy, vocab_size=MODEL.vocab_size)


FEW = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
FIND = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=True,
    phases=[Phase.generate],
)

# pytest collects this unittest.TestCase: the documented way to run a configured machine
TestBuiltinBatchMachine = pytest.mark.slow(_machine(_builtin).TestCase)
TestBuiltinBatchMachine.settings = FEW


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine",
    [zoo.BatchZooEngine, zoo.BatchReplayEngine, zoo.BatchFifoTwoRows, zoo.BatchRecomputeOnly],
    ids=lambda e: e.__name__,
)
def test_correct_engines_that_batch_differently_pass(engine: type) -> None:
    run_state_machine_as_test(_machine(engine), settings=FEW)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("member", "prop"),
    [
        (zoo.BatchPadsRecurrentState, "isolation"),
        (zoo.BatchSlotNotCleared, "isolation"),
        (zoo.BatchStaleResume, "isolation"),
        (zoo.BatchVerifyDependsOnBatchSize, "isolation"),
        (zoo.BatchRetriesRejectedRow, "liveness"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_batch_zoo_members_are_rejected(member: type, prop: str) -> None:
    with pytest.raises(BatchMachineFailure, match=rf"^\[{prop}\]"):
        run_state_machine_as_test(_machine(member), settings=FIND)


def test_the_base_class_and_bad_options_are_clear_errors() -> None:
    with pytest.raises(InvalidSettingError, match=r"BatchMachine.configure\(engine_factory=..."):
        BatchMachine()
    with pytest.raises(StrategyArgumentError, match="greedy"):
        BatchMachine.configure(engine_factory=_builtin, greedy=None, vocab_size=8)  # type: ignore[arg-type]
    with pytest.raises(StrategyArgumentError, match="max_requests"):
        BatchMachine.configure(engine_factory=_builtin, greedy=plain_greedy, vocab_size=8, max_requests=0)
    with pytest.raises(StrategyArgumentError, match="tie_tolerance"):
        BatchMachine.configure(engine_factory=_builtin, greedy=plain_greedy, vocab_size=8, tie_tolerance=-1)
