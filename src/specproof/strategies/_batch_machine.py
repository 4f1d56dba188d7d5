"""``BatchMachine``: a Hypothesis state machine over a batched engine's scheduler (docs/contract.md, "Batches").

Where ``batch_schedules`` draws a whole schedule up front, the machine interleaves the scheduler's
calls freely: its rules are ``add_request`` (a prompt, a budget, an EOS placed in its greedy
continuation, a scripted draft plan), ``step``, ``step_only`` (``step(only=...)`` on a drawn subset,
where the engine is ``schedulable``), ``abort`` and ``preempt`` (each declared mode). Its judge is the
trusted greedy oracle handed to ``configure`` (plain greedy on a fresh model), never the engine's code:

- ``isolation``: each finished request equals its solo run (tie-aware, ``compare_lossless``), and an
  aborted one's partial output is a prefix of it;
- ``liveness``: every round commits a token for each request it advances, a plain ``step`` advances
  some request while any is in flight, and teardown drains the engine within a bound;
- ``bookkeeping``: the engine reports unfinished requests exactly while some are in flight, and a step
  advances only requests in flight (and, with ``only``, only those named).

A failure raises ``BatchMachineFailure`` (an ``AssertionError``, ``[property] explanation``) and
Hypothesis shrinks the program to the fewest calls that still fail. Use it as a test base (as
``RollbackMachine``): ``TestMine = BatchMachine.configure(engine_factory=..., greedy=..., vocab_size=...).TestCase``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Self

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from specproof.contract import BatchRequest, Generation, RequestOutput
from specproof.contract.errors import InvalidSettingError
from specproof.contract.lossless import compare_lossless
from specproof.contract.validation import int_at_least
from specproof.strategies._contexts import StrategyArgumentError
from specproof.strategies._machine import configured_machine
from specproof.strategies._rounds import ScriptedDrafter, round_plans

__all__ = ["BatchMachine", "BatchMachineFailure"]

GreedyOracle = Callable[[Sequence[int], int, "int | None"], Sequence[int]]


class BatchMachineFailure(AssertionError):
    """A property broke: ``str(self)`` is ``[property] explanation``."""

    def __init__(self, prop: str, explanation: str) -> None:
        super().__init__(f"[{prop}] {explanation}")
        self.prop = prop
        self.explanation = explanation


@attrs.frozen(kw_only=True)
class _BatchMachineConfig:
    engine_factory: Callable[[], Any]
    greedy: GreedyOracle
    vocab_size: int
    k: int
    max_prompt: int
    max_new_tokens: int
    max_requests: int
    tie_tolerance: float


class BatchMachine(RuleBasedStateMachine):
    """A stateful fuzzer of a ``BatchEngine``'s scheduler (abstract: use ``configure``)."""

    _batch_config: ClassVar[_BatchMachineConfig | None] = None

    @classmethod
    def configure(
        cls,
        *,
        engine_factory: Callable[[], Any],
        greedy: GreedyOracle,
        vocab_size: int,
        k: int = 4,
        max_prompt: int = 8,
        max_new_tokens: int = 8,
        max_requests: int = 6,
        tie_tolerance: float = 0.0,
        stateful_step_count: int = 25,
        name: str | None = None,
    ) -> type[Self]:
        """A runnable subclass for one engine: ``engine_factory()`` builds a fresh engine per program;
        ``greedy(prompt, n, eos)`` is plain greedy on a fresh copy of the model (the judge)."""
        where = "BatchMachine.configure()"
        for opt, value in (("engine_factory", engine_factory), ("greedy", greedy)):
            if not callable(value):
                raise StrategyArgumentError(f"{where}: {opt}={value!r} must be callable")
        for opt, number, minimum in (
            ("vocab_size", vocab_size, 2),
            ("k", k, 0),
            ("max_prompt", max_prompt, 1),
            ("max_new_tokens", max_new_tokens, 1),
            ("max_requests", max_requests, 1),
            ("stateful_step_count", stateful_step_count, 1),
        ):
            int_at_least(number, name=opt, minimum=minimum, where=where, error=StrategyArgumentError)
        if isinstance(tie_tolerance, bool) or not isinstance(tie_tolerance, (int, float)) or not tie_tolerance >= 0:
            raise StrategyArgumentError(f"{where}: tie_tolerance={tie_tolerance!r} must be a number >= 0")
        config = _BatchMachineConfig(
            engine_factory=engine_factory,
            greedy=greedy,
            vocab_size=vocab_size,
            k=k,
            max_prompt=max_prompt,
            max_new_tokens=max_new_tokens,
            max_requests=max_requests,
            tie_tolerance=float(tie_tolerance),
        )
        return configured_machine(  # type: ignore[no-any-return]
            cls, name or f"Configured{cls.__name__}", {"_batch_config": config}, stateful_step_count=stateful_step_count
        )

    def __init__(self) -> None:
        super().__init__()
        config = type(self)._batch_config
        if config is None:
            raise InvalidSettingError(
                "BatchMachine.configure(engine_factory=..., greedy=..., vocab_size=...) first: the base class "
                "has no engine to drive"
            )
        self.config = config
        self.engine = config.engine_factory()
        self.capabilities = self.engine.batch_capabilities
        self.added = 0
        self.requests: dict[str, BatchRequest] = {}
        self.live: set[str] = set()  # added, neither finished nor aborted
        self.running: set[str] = set()  # advanced since added or resumed: preemptable
        self.to_judge: list[tuple[str, Generation]] = []
        self.broken = False  # a property already broke: teardown leaves the engine as it is

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: self.added < self.config.max_requests)
    @rule(data=st.data())
    def add_request(self, data: st.DataObject) -> None:
        cfg = self.config
        prompt = data.draw(
            st.lists(st.integers(0, cfg.vocab_size - 1), min_size=1, max_size=cfg.max_prompt), label="prompt"
        )
        n = data.draw(st.integers(1, cfg.max_new_tokens), label="max_new_tokens")
        plan = data.draw(round_plans(k=cfg.k, max_rounds=4), label="draft plan")
        continuation = list(cfg.greedy(prompt, n + cfg.k + 1, None))
        eos_at = data.draw(st.none() | st.integers(0, n - 1), label="eos at")
        request = BatchRequest(
            request_id=f"m{self.added}",
            prompt=tuple(prompt),
            max_new_tokens=n,
            eos_token_id=None if eos_at is None else continuation[eos_at],
            drafter=ScriptedDrafter(prompt, continuation, plan, vocab_size=cfg.vocab_size),
        )
        self.added += 1
        self.engine.add_request(request)
        self.requests[request.request_id] = request
        self.live.add(request.request_id)

    @rule()
    def step(self) -> None:
        outputs = self.engine.step()
        if self.live and not any(out.step is not None or out.finished is not None for out in outputs):
            raise self._fail("liveness", f"step() advanced no request while {sorted(self.live)} were in flight")
        self._record(outputs, only=None)

    @precondition(lambda self: self.live and self.capabilities.schedulable)
    @rule(data=st.data())
    def step_only(self, data: st.DataObject) -> None:
        chosen = data.draw(st.sets(st.sampled_from(sorted(self.live)), min_size=1), label="only")
        self._record(self.engine.step(only=chosen), only=chosen)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.live)), label="abort")
        partial = list(self.engine.abort_request(request_id).tokens)
        self.live.discard(request_id)
        self.running.discard(request_id)
        expected = self._solo(request_id)
        if partial != expected[: len(partial)]:
            raise self._fail(
                "isolation",
                f"aborted {request_id}'s partial output {partial} is not a prefix of its solo run {expected}",
            )

    @precondition(lambda self: self.running and self.capabilities.preemption)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.running)), label="preempt")
        mode = data.draw(st.sampled_from(self.capabilities.preemption), label="mode")
        self.engine.preempt(request_id, mode=mode)
        self.running.discard(request_id)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def finished_requests_equal_their_solo_runs(self) -> None:
        judged, self.to_judge = self.to_judge, []
        for request_id, generation in judged:
            request = self.requests[request_id]
            expected = self._solo(request_id)
            verdict = compare_lossless(
                generation.tokens,
                expected,
                tie_tolerance=self.config.tie_tolerance,
                actual_stop_reason=generation.stop_reason,
                expected_stop_reason="eos" if request.eos_token_id in expected else "max_new_tokens",
            )
            breach = verdict.breach()
            if breach is not None:
                raise self._fail(
                    "isolation",
                    f"{request_id} differs from its solo run: {breach['explanation']} "
                    f"(expected {expected}, got {list(generation.tokens)})",
                )

    @invariant()
    def unfinished_exactly_while_in_flight(self) -> None:
        if bool(self.engine.has_unfinished_requests()) != bool(self.live):
            raise self._fail(
                "bookkeeping",
                f"has_unfinished_requests() is {self.engine.has_unfinished_requests()} with "
                f"{sorted(self.live)} in flight",
            )

    def teardown(self) -> None:
        """Drain the engine: every request still in flight finishes within a bound, equal to its solo run."""
        if self.broken:
            return
        bound = sum(self.requests[i].max_new_tokens + 2 for i in self.live) + 2
        for _ in range(bound):
            if not self.live:
                break
            self.step()
        if self.live:
            raise self._fail("liveness", f"{sorted(self.live)} still in flight after {bound} more steps")
        self.finished_requests_equal_their_solo_runs()

    # ------------------------------------------------------------------ helpers

    def _fail(self, prop: str, explanation: str) -> BatchMachineFailure:
        self.broken = True
        return BatchMachineFailure(prop, explanation)

    def _solo(self, request_id: str) -> list[int]:
        request = self.requests[request_id]
        return list(self.config.greedy(request.prompt, request.max_new_tokens, request.eos_token_id))

    def _record(self, outputs: list[RequestOutput], *, only: set[str] | None) -> None:
        for out in outputs:
            rid = out.request_id
            if rid not in self.live or (only is not None and rid not in only):
                raise self._fail(
                    "bookkeeping", f"a step advanced {rid!r}, not in flight{'' if only is None else ' nor named'}"
                )
            if out.step is not None and not out.new_tokens:
                raise self._fail("liveness", f"a round committed no token for {rid}")
            self.running.add(rid)
            if out.finished is not None:
                self.live.discard(rid)
                self.running.discard(rid)
                self.to_judge.append((rid, out.finished))
