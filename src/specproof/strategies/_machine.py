"""``RollbackMachine``: a Hypothesis state machine that drives an engine through every rollback path.

The machine holds one conversation at a time with the decoder under test and steps
it round by round (``session.generate(n, eos_token_id=..., max_rounds=1)``). Each
speculative round is scripted: the machine asks a trusted *oracle* model for the next
greedy tokens and hands the engine a draft that is right for exactly as many tokens as
the drawn ``PlannedRound`` says. After every step it checks the decode convention
against a second trusted model, the *reference*, fed the same tokens with plain forwards:

- ``lossless``: the session's context is the machine's (prompt, user turns and
  the greedy continuation of each), and each round emitted exactly what a lossless
  engine emits for that draft (the machine's own accept loop: it shares no code with
  the decoder it judges);
- ``kv-length``: ``target.processed == len(ctx) - 1``;
- ``state``: where the target has ``state_arrays()``, its arrays equal
  the reference's after feeding ``ctx[:-1]`` (bitwise, or within ``tolerance``);
  otherwise the logits of the pending token equal the reference's (a probe forward
  between ``snapshot()`` and ``restore()`` of the target).

A failure raises ``RollbackMachineFailure`` (an ``AssertionError``) whose message starts
with the property in brackets (``[kv-length]``); certification reports it as a violation
of the rollback-machine invariant (docs/contract.md). The reference and oracle are only
ever fed forwards and reset, never restored, so a broken ``restore`` in the target family
cannot hide itself in the judges.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import numpy as np
from hypothesis import HealthCheck, Phase, event
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from specproof.contract import arrays_differ, validate_tolerance
from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least
from specproof.engine import ROLLBACK_STRATEGIES, SpecDecoder
from specproof.strategies._contexts import CONTEXT_KINDS, StrategyArgumentError, check_kinds, contexts
from specproof.strategies._local_constants import no_local_constants
from specproof.strategies._rounds import PlannedRound, RoundPlan, ScriptedDrafter, planned_round
from specproof.strategies._sampled_round import SampledRounds
from specproof.strategies._tree_round import with_tree_rounds

__all__ = [
    "PROPERTIES",
    "RollbackMachine",
    "RollbackMachineFailure",
    "default_decoder_factory",
    "release_machine",
    "run_rollback_machine",
]

PROPERTIES: dict[str, str] = {
    "lossless": "the session's context and every round's tokens are what plain greedy and the accept rule give",
    "kv-length": "target.processed == len(ctx) - 1 after every step",
    "state": "the target's state (or the pending token's logits) equals the reference's fed ctx[:-1]",
    "restore": "snapshot(), forward, restore(snapshot) puts the target back",
    "processed": "restoring a snapshot taken before a round sets processed back",
    "stop": "the engine never drafts past max_new_tokens or the context",
    "step-record": "a round's Step record agrees with the drafter and with its own argmax",
    "sampled": "a sampled round keeps a prefix of its draft, then a token with p > 0 other than the draft token",
}
"""What the machine checks after every step, by the name its failures carry."""


class RollbackMachineFailure(AssertionError):
    """A property of ``PROPERTIES`` broke: ``str(self)`` is ``[property] where: explanation``."""

    def __init__(self, prop: str, explanation: str, *, round: int | None, example: Mapping[str, object]) -> None:
        super().__init__(f"[{prop}] {explanation}")
        self.prop = prop
        self.explanation = explanation
        self.round = round
        self.example = dict(example)


def _fresh_at(factory: Callable[[], Any], tokens: Sequence[int]) -> Any:
    """A judge fed ``tokens`` with plain forwards from a fresh, reset model (no memo)."""
    model = factory()
    model.reset()
    if tokens:
        model.forward(list(tokens))
    return model


class _FreshJudges:
    at = staticmethod(_fresh_at)


def _matching_prefix(draft: Sequence[int], reference: Sequence[int]) -> int:
    """How many leading draft tokens equal the reference's: the machine's own accept loop.

    Written here, not imported from the engine: a judge shares no logic with what it judges.
    """
    count = 0
    for proposed, wanted in zip(draft, reference):
        if int(proposed) != int(wanted):
            break
        count += 1
    return count


DecoderFactory = Callable[[Any, Any, int, str], Any]


def default_decoder_factory(target: Any, drafter: Any, k: int, rollback: str) -> SpecDecoder:
    """``specproof.engine.SpecDecoder(target, drafter, k=k, rollback=rollback)``."""
    return SpecDecoder(target, drafter, k=k, rollback=rollback)  # type: ignore[arg-type]


@attrs.frozen(kw_only=True)
class _MachineConfig:
    target_factory: Callable[[], Any]
    reference_factory: Callable[[], Any]
    decoder_factory: DecoderFactory
    max_k: int
    tolerance: float
    rollbacks: tuple[str, ...]
    max_prompt: int
    context_kinds: tuple[str, ...]
    judges: Any
    sampled_rounds: bool = True


class _SwitchDrafter:
    """The drafter the decoder under test holds; the machine swaps in one script per round.

    Outside a scripted round (plain steps, prefill) it proposes nothing and records the call.
    """

    name = "RollbackMachine.drafter"

    def __init__(self) -> None:
        self.script: ScriptedDrafter | None = None
        self.unscripted_calls: list[int] = []

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if self.script is None:
            self.unscripted_calls.append(int(k))
            return []
        return self.script.propose(context, k)

    def reset(self) -> None:
        if self.script is not None:
            self.script.reset()


def _fmt(tokens: Sequence[int], limit: int = 16) -> str:
    seq = list(tokens)
    return str(seq) if len(seq) <= limit else f"[{len(seq)} tokens: {seq[:8]} ... {seq[-4:]}]"


def _compare_arrays(name: str, got: np.ndarray, want: np.ndarray, tolerance: float) -> str | None:
    """None when equal under the contract's one comparison policy (``specproof.contract.compare``)."""
    return arrays_differ(want, got, atol=tolerance, name=name)


def check_tolerance(value: object, *, where: str, name: str) -> float:
    """The contract's tolerance validator, raising ``StrategyArgumentError`` (an ``InvalidArgument``)."""
    try:
        return validate_tolerance(value, name=name)
    except ValueError as exc:
        raise StrategyArgumentError(f"{where}: {exc}") from None


def configured_machine(
    base: type[Any], name: str, attributes: dict[str, object], *, stateful_step_count: int
) -> type[Any]:
    """A runnable subclass of a state machine carrying its configuration (shared by both machines).

    No explain phase: it re-runs the failing program under a tracer, which takes minutes on a
    numpy model; the shrunk program and the invariant message already say what broke.
    """
    sub: Any = type(name, (base,), {**attributes, "__module__": base.__module__, "_config_names": tuple(attributes)})
    sub.TestCase.settings = Settings(
        deadline=None,
        suppress_health_check=list(HealthCheck),
        stateful_step_count=stateful_step_count,
        phases=tuple(p for p in Settings().phases if p is not Phase.explain),
    )
    return sub


def release_machine(machine: type[Any]) -> None:
    """Drop the configuration a configured machine class (or a subclass of one) carries, its run over.

    Hypothesis keeps the last 128 machine classes in ``lru_cache``s
    (``RuleBasedStateMachine._to_test_case``, ``RuleStrategy._setup_for``), and a configuration
    holds target and engine factories, judges and the certification's oracle closures: a process
    that certifies again and again (a campaign worker) kept every run's models until 128 runs
    were held. A released class refuses to run again (its ``__init__`` says to ``configure``).
    """
    for klass in machine.__mro__:
        for name in vars(klass).get("_config_names", ()):
            if name.endswith("_config"):
                setattr(klass, name, None)


def _machine_config(
    *,
    target_factory: Callable[[], Any],
    reference_factory: Callable[[], Any] | None,
    decoder_factory: DecoderFactory | None,
    max_k: int,
    tolerance: float,
    rollbacks: Iterable[str],
    max_prompt: int,
    context_kinds: Iterable[str] | None,
    stateful_step_count: int,
    judges: Any,
    sampled_rounds: bool = True,
) -> _MachineConfig:
    """``RollbackMachine.configure``'s options validated (a ``StrategyArgumentError`` names the bad one)."""
    where = "RollbackMachine.configure()"
    if not callable(target_factory):
        raise StrategyArgumentError(f"{where}: target_factory={target_factory!r} must be callable")
    if reference_factory is not None and not callable(reference_factory):
        raise StrategyArgumentError(f"{where}: reference_factory={reference_factory!r} must be callable or None")
    if decoder_factory is not None and not callable(decoder_factory):
        raise StrategyArgumentError(f"{where}: decoder_factory={decoder_factory!r} must be callable or None")
    for opt, value, minimum in (
        ("max_k", max_k, 0),
        ("max_prompt", max_prompt, 1),
        ("stateful_step_count", stateful_step_count, 1),
    ):
        int_at_least(value, name=opt, minimum=minimum, where=where, error=StrategyArgumentError)
    tolerance = check_tolerance(tolerance, where=where, name="tolerance")
    if judges is not None and not callable(getattr(judges, "at", None)):
        raise StrategyArgumentError(f"{where}: judges={judges!r} must have an at(factory, tokens) method or be None")
    if isinstance(rollbacks, str):
        raise StrategyArgumentError(f"{where}: rollbacks={rollbacks!r} must be a collection of names, not a string")
    chosen = tuple(dict.fromkeys(rollbacks))
    if not chosen or any(r not in ROLLBACK_STRATEGIES for r in chosen):
        raise StrategyArgumentError(
            f"{where}: rollbacks={chosen!r} must be a non-empty subset of {ROLLBACK_STRATEGIES}"
        )
    return _MachineConfig(
        target_factory=target_factory,
        reference_factory=reference_factory or target_factory,
        decoder_factory=decoder_factory or default_decoder_factory,
        max_k=max_k,
        tolerance=float(tolerance),
        rollbacks=chosen,
        max_prompt=max_prompt,
        context_kinds=check_kinds(context_kinds, known=CONTEXT_KINDS, where=where),
        judges=judges if judges is not None else _FreshJudges(),
        sampled_rounds=bool(sampled_rounds),
    )


def _checked_models(cfg: _MachineConfig, target: Any, reference: Any, oracle: Any) -> tuple[int, int, tuple[str, ...]]:
    """The target's ``vocab_size`` and ``max_context`` and the usable rollbacks, once the three models are
    checked to be distinct, complete and alike (``InvalidSettingError`` otherwise)."""
    if len({id(target), id(reference), id(oracle)}) < 3:
        raise InvalidSettingError(
            "RollbackMachine: target_factory/reference_factory returned the same object twice; the machine "
            "needs three independent instances (target under test, reference, oracle)"
        )
    for role, model in (("target", target), ("reference", reference)):
        for attr in ("vocab_size", "max_context", "processed", "forward", "reset"):
            if not hasattr(model, attr):
                raise InvalidSettingError(f"RollbackMachine: the {role} {model!r} has no {attr!r}")
    vocab_size = int(target.vocab_size)
    max_context = int(target.max_context)
    if (int(reference.vocab_size), int(reference.max_context)) != (vocab_size, max_context):
        raise InvalidSettingError(
            f"RollbackMachine: the reference has vocab_size={reference.vocab_size}, max_context="
            f"{reference.max_context}; the target has {vocab_size}, {max_context}"
        )
    if vocab_size < 2:
        raise InvalidSettingError("RollbackMachine: a target with fewer than 2 token ids cannot be given a wrong draft")
    checkpoints = callable(getattr(target, "forward_with_checkpoints", None))
    rollbacks = tuple(r for r in cfg.rollbacks if r != "checkpoint" or checkpoints)
    if not rollbacks:
        raise InvalidSettingError(
            "RollbackMachine: rollbacks=('checkpoint',) but the target has no forward_with_checkpoints"
        )
    return vocab_size, max_context, rollbacks


def _state_problem(target: Any, theirs: Mapping[str, np.ndarray], tol: float, *, fed: int) -> str | None:
    """What differs between the target's state arrays and the reference's (fed ``fed`` tokens); None if nothing."""
    own = getattr(target, "state_differs", None)  # a wire view: digests, or a CRC-32 mismatch
    if callable(own):
        if problem := own(theirs, atol=tol):
            return f"{problem}; the reference was fed ctx[:-1] ({fed} tokens)"
        return None
    mine: Mapping[str, np.ndarray] = target.state_arrays()
    if set(mine) != set(theirs):
        return f"the target's state arrays {sorted(mine)} are not the reference's {sorted(theirs)}"
    # every differing array, so a corrupt recurrent state is seen next to the KV it went on to spoil
    problems = [p for name in mine if (p := _compare_arrays(name, mine[name], theirs[name], tol))]
    if problems:
        return f"{'; '.join(problems)}; the reference was fed ctx[:-1] ({fed} tokens) with plain forwards"
    return None


def _probe_twice(target: Any, pending: int) -> list[np.ndarray]:
    """The pending token's logits row, twice, each forward between ``snapshot()`` and ``restore()``.

    The second probe shows whether restore() undid the first, so a broken restore is reported as
    such instead of as corrupt engine state in a later round.
    """
    snap = target.snapshot()
    rows = []
    for _ in range(2):
        try:
            rows.append(np.array(target.forward([pending]), copy=True)[0])
        finally:
            target.restore(snap)
    return rows


def _lossless_emission(
    draft: list[int], upcoming: list[int], j: int, *, budget: int, eos: int | None
) -> tuple[list[int], str]:
    """What a lossless engine emits for ``draft`` (its first ``j`` tokens match greedy's ``upcoming``), cut at
    ``budget`` and at ``eos``, and the round's path (``empty_draft``, ``all_accepted``, ``rejected_at_0``,
    ``partial``)."""
    accepted = [*draft[:j], upcoming[j]]
    expected = accepted[:budget]
    if eos is not None and eos in expected:
        expected = expected[: expected.index(eos) + 1]
    if not draft:
        path = "empty_draft"
    elif j == len(draft):
        path = "all_accepted"
    else:
        path = "rejected_at_0" if j == 0 else "partial"
    return expected, path


def _step_record_problem(step: Any, draft: list[int]) -> str | None:
    """What a round's ``Step`` gets wrong against the drafter's draft and its own argmax; None if nothing."""
    if list(step.draft) != draft:
        return f"the step records draft={list(step.draft)}; the drafter proposed {draft}"
    argmax = list(step.argmax)
    if len(argmax) != len(draft) + 1:
        return f"the step records {len(argmax)} argmax ids for a verify of {len(draft) + 1} tokens"
    j = _matching_prefix(draft, argmax)
    if list(step.accepted) != [*draft[:j], argmax[j]]:
        return (
            f"the step records accepted={list(step.accepted)} for draft {draft} and argmax {argmax}; "
            f"the accept rule gives {[*draft[:j], argmax[j]]} (j={j})"
        )
    return None


def _draw_prompt(
    data: Any, placement: str, cfg: _MachineConfig, *, k: int, vocab_size: int, max_context: int
) -> list[int]:
    """An ``ordinary`` prompt of up to ``max_prompt`` tokens, or (``near_max_context``) a drawn seed tiled to
    end within ``k + 1`` tokens of ``max_context``."""
    if placement == "ordinary":
        top = min(cfg.max_prompt, max_context)
        prompt: list[int] = data.draw(contexts(vocab_size, max_size=top, kinds=cfg.context_kinds), label="prompt")
        return prompt
    slack = data.draw(st.integers(0, min(k + 1, max_context - 1)), label="room after the prompt")
    seed = data.draw(
        contexts(vocab_size, max_size=min(16, max_context), kinds=cfg.context_kinds),
        label="prompt seed (tiled to max_context - room)",
    )
    length = max_context - slack
    tiled: list[int] = (seed * (length // len(seed) + 1))[:length]
    return tiled


def _round_tags(path: str, *, clamped: bool, eos_inside: bool) -> list[str]:
    """The round's path and, when they apply, ``clamped_draft`` and ``eos_inside_draft`` (for ``observed_paths``)."""
    return [path, *(["clamped_draft"] if clamped else []), *(["eos_inside_draft"] if eos_inside else [])]


class _Judging:
    """The ``RollbackMachine``'s judging half: its two trusted models and the decode-convention checks.

    The reference is fed ``ctx[:-1]`` to compare state with; the oracle gives the greedy
    continuation the drafts are scripted from. Both are only ever fed forwards and reset (or
    rebuilt by ``cfg.judges``), never restored. Every check fails through ``_fail``, which
    names the property, the rule that ran last and the conversation.
    """

    cfg: _MachineConfig
    target: Any
    reference: Any
    oracle: Any
    session: Any
    white_box: bool
    max_context: int
    ctx: list[int]
    k: int
    rollback: str
    conversation: int
    rounds: int
    last_step: str
    _ref_fed: list[int]
    _traj: list[int]
    _traj_from: int

    def _feed_reference(self, tokens: list[int]) -> None:
        """Bring the reference to having processed exactly ``tokens`` (incrementally when it can)."""
        fed = self._ref_fed
        # from nothing, the judges' memo feeds it: it may hold the prompt already, and keeps it for the oracle
        if fed and len(fed) <= len(tokens) and tokens[: len(fed)] == fed:
            delta = tokens[len(fed) :]
            if delta:
                self.reference.forward(list(delta))
        else:
            self.reference = self.cfg.judges.at(self.cfg.reference_factory, tokens)
        self._ref_fed = list(tokens)

    def _greedy(self, n: int) -> list[int]:
        """The next ``n`` plain-greedy tokens after ``self.ctx`` (fewer if the context fills up)."""
        ctx = self.ctx
        traj = self._traj
        if not (len(ctx) >= self._traj_from and len(traj) >= len(ctx) and traj[: len(ctx)] == ctx):
            self.oracle = self.cfg.judges.at(self.cfg.reference_factory, ctx[:-1])
            traj = self._traj = list(ctx)
            self._traj_from = len(ctx)
        while len(traj) < len(ctx) + n and self.oracle.processed < self.max_context:
            row = np.asarray(self.oracle.forward([traj[-1]]))[0]
            traj.append(int(np.argmax(row)))  # first maximum: lowest id wins a tie
        return traj[len(ctx) : len(ctx) + n]

    def _fail(self, prop: str, explanation: str, **example: object) -> None:
        assert prop in PROPERTIES, prop
        rnd = self.rounds - 1 if self.rounds else None
        where = (
            f"after rule {self.last_step} (conversation {self.conversation}: k={self.k}, rollback={self.rollback}, "
            f"ctx={_fmt(self.ctx)})"
        )
        raise RollbackMachineFailure(prop, f"{where}: {explanation}", round=rnd, example=example)

    def _check_context(self) -> None:
        got = list(self.session.context)
        if got != self.ctx:
            at = next((i for i, (a, b) in enumerate(zip(got, self.ctx)) if a != b), min(len(got), len(self.ctx)))
            self._fail(
                "lossless",
                f"the session's context differs from prompt + user turns + greedy continuation at index {at}: "
                f"session has {_fmt(got[at : at + 8])}, plain greedy gives {_fmt(self.ctx[at : at + 8])} "
                f"(lengths {len(got)} vs {len(self.ctx)})",
            )

    def _check_kv_length(self, ctx: list[int], prop: str = "kv-length") -> None:
        processed = int(self.target.processed)
        if processed != len(ctx) - 1:
            self._fail(
                prop,
                f"target.processed={processed} but the context has {len(ctx)} tokens, so it must be {len(ctx) - 1} "
                f"(every token but the pending one)",
            )

    def _check_state(self, ctx: list[int], prop: str = "state") -> None:
        tol = self.cfg.tolerance
        self._feed_reference(ctx[:-1])
        if self.white_box:
            problem = _state_problem(self.target, self.reference.state_arrays(), tol, fed=len(ctx) - 1)
            if problem:
                self._fail(prop, problem)
            return
        if len(ctx) > self.max_context:
            return  # the pending token cannot be fed: nothing left to observe
        rows = _probe_twice(self.target, ctx[-1])
        want = np.asarray(self.reference.forward([ctx[-1]]))[0]
        self._ref_fed = list(ctx)
        problem = _compare_arrays("the logits row of the pending token", rows[0], want, tol)
        if problem:
            self._fail(
                prop,
                f"{problem} (observed with a probe forward between snapshot() and restore(); the reference was fed "
                f"ctx[:-1] with plain forwards)",
            )
        again = _compare_arrays("a second probe of the pending token", rows[1], rows[0], tol)
        if again:
            self._fail(
                "restore",
                f"snapshot(), forward([pending]), restore(snapshot) did not put the target back: {again} "
                "(here 'reference' is the first probe's row)",
            )

    def _check_step(self, step: Any, draft: list[int]) -> None:
        """The round's ``Step`` record agrees with the drafter and with its own argmax (when an engine keeps steps)."""
        if problem := _step_record_problem(step, draft):
            self._fail("step-record", problem)


class RollbackMachine(_Judging, RuleBasedStateMachine):
    """A stateful fuzzer for lossless speculative decoding with rollback (abstract: use ``configure``).

    Rules (each draws its arguments with labelled ``data.draw`` calls, which Hypothesis prints in a failing
    program):

    - ``start_conversation`` / ``new_conversation``: a prompt from ``contexts`` (or, on purpose, one that
      ends within ``k + 1`` tokens of ``max_context``), a ``k`` in ``0..max_k`` and a rollback strategy;
      builds the decoder and starts a session;
    - ``spec_round``: one speculative round following a drawn ``PlannedRound`` (all accepted, empty draft,
      rejected at 0, partial, short draft), with a ``max_new_tokens`` that may cut the round and an EOS
      that may land inside it;
    - ``plain_step``: a round with ``max_new_tokens=1`` (effective k = 0, no draft);
    - ``snapshot_round_trip``: snapshot the target, run a round, restore, check the target is back at the
      old context, then re-feed the round's tokens and go on;
    - ``user_turn``: ``session.extend(tokens)`` with a short context;
    - ``sampled_round`` (``configure(sampled_rounds=True)``): a round at temperature > 0 (``_sampled_round``);
    - ``tree_round`` (``configure(tree_rounds=True)``): a greedy token-tree round, then a restore of the
      snapshot taken before it and its tokens handed to the session (``_tree_round``).

    The invariant method checks ``lossless``, ``kv-length`` and ``state`` (``PROPERTIES``) after every step;
    failures raise ``RollbackMachineFailure`` (an ``AssertionError``) whose message starts with the property
    in brackets and names the rule, the draft and the array that differs. ``observed_paths`` (per configured
    class) counts the round paths taken."""

    _rollback_config: ClassVar[_MachineConfig | None] = None
    observed_paths: ClassVar[Counter[str]] = Counter()

    # ----------------------------------------------------------------- configuration

    @classmethod
    def configure(
        cls,
        *,
        target_factory: Callable[[], Any],
        reference_factory: Callable[[], Any] | None = None,
        decoder_factory: DecoderFactory | None = None,
        max_k: int = 8,
        tolerance: float = 0.0,
        rollbacks: Iterable[str] = ROLLBACK_STRATEGIES,
        max_prompt: int = 24,
        context_kinds: Iterable[str] | None = None,
        stateful_step_count: int = 25,
        name: str | None = None,
        judges: Any = None,
        sampled_rounds: bool = True,
        tree_rounds: bool = False,
    ) -> type[RollbackMachine]:
        """A runnable subclass for one implementation under test.

        ``target_factory()`` builds the target under test (called once per run); ``reference_factory()``
        (default: ``target_factory``) builds the trusted model the machine judges with (called twice per
        run: reference and oracle); ``decoder_factory(target, drafter, k, rollback)`` (default
        ``SpecDecoder``) builds the decoder under test: an object whose ``.start(prompt)`` returns a session
        with ``.generate(n, eos_token_id=..., max_rounds=1)``, ``.extend(tokens)`` and ``.context``.
        ``tolerance`` is the largest allowed absolute difference of state arrays or logits (0: bitwise). The
        subclass's ``TestCase`` runs ``stateful_step_count`` steps per example, ``max_examples`` from the
        profile, and skips Hypothesis's ``explain`` phase (minutes under a tracer on a numpy model).
        ``judges`` (optional) is a memo with ``.at(factory, tokens)`` returning a private model fed
        ``tokens`` by forwards (a certification passes its own); by default each judge is built fresh and
        fed from scratch. ``sampled_rounds``: a third of the conversations also run rounds at
        ``temperature > 0`` (``--sampling``); ``tree_rounds``: token-tree rounds on a target with
        ``forward_tree`` (``_tree_round``; ``--trees``)."""
        config = _machine_config(
            target_factory=target_factory,
            reference_factory=reference_factory,
            decoder_factory=decoder_factory,
            max_k=max_k,
            tolerance=tolerance,
            rollbacks=rollbacks,
            max_prompt=max_prompt,
            context_kinds=context_kinds,
            stateful_step_count=stateful_step_count,
            judges=judges,
            sampled_rounds=sampled_rounds,
        )
        base: type[RollbackMachine] = _with_sampled_rounds(cls) if sampled_rounds else cls
        base = with_tree_rounds(base) if tree_rounds else base
        return configured_machine(
            base,
            name or f"{cls.__name__}For_{getattr(target_factory, '__name__', 'target')}",
            {"_rollback_config": config, "observed_paths": Counter()},
            stateful_step_count=stateful_step_count,
        )

    # ----------------------------------------------------------------- set-up

    def __init__(self) -> None:
        super().__init__()
        cfg = type(self)._rollback_config
        if cfg is None:
            raise InvalidSettingError(
                "RollbackMachine is a base class: build a runnable machine with "
                "RollbackMachine.configure(target_factory=...) and run that (or use run_rollback_machine)"
            )
        self.cfg = cfg
        self.target = cfg.target_factory()
        self.reference = cfg.reference_factory()
        self.oracle = cfg.reference_factory()
        self.vocab_size, self.max_context, self.rollbacks = _checked_models(
            cfg, self.target, self.reference, self.oracle
        )
        self.white_box = callable(getattr(self.target, "state_arrays", None)) and callable(
            getattr(self.reference, "state_arrays", None)
        )
        self.drafter = _SwitchDrafter()
        self.session: Any = None
        self.decoder: Any = None
        self.k = 0
        self.rollback = self.rollbacks[0]
        self.ctx: list[int] = []
        self.conversation = 0
        self.rounds = 0  # rounds run in this conversation
        self.last_step = "start_conversation"
        self._ref_fed: list[int] = []  # what self.reference has processed
        self._traj: list[int] = []  # the oracle has processed _traj[:-1]; _traj[_traj_from:] is greedy
        self._traj_from = 0
        self._plans: dict[int, st.SearchStrategy[PlannedRound]] = {}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(conversation={self.conversation}, k={self.k}, rollback={self.rollback}, "
            f"ctx={_fmt(self.ctx)})"
        )

    @invariant()
    def decode_convention_holds(self) -> None:
        """``lossless`` (context), ``kv-length`` and ``state`` (``PROPERTIES``)."""
        if self.session is None:
            return
        self._check_context()
        self._check_kv_length(self.ctx)
        self._check_state(self.ctx)

    # ----------------------------------------------------------------- conversations

    def _start(self, data: Any, rule_name: str) -> None:
        cfg = self.cfg
        self.k = data.draw(st.integers(0, cfg.max_k), label="k")
        self.rollback = data.draw(st.sampled_from(self.rollbacks), label="rollback")
        # near-max-context prompts fill up within a round or two: draw them a third of the time
        placement = data.draw(st.sampled_from(("ordinary", "ordinary", "near_max_context")), label="prompt placement")
        prompt = _draw_prompt(data, placement, cfg, k=self.k, vocab_size=self.vocab_size, max_context=self.max_context)
        self.conversation += 1
        self.rounds = 0
        self.last_step = f"{rule_name}(k={self.k}, rollback={self.rollback}, prompt={_fmt(prompt)})"
        self.drafter.script = None
        self.decoder = cfg.decoder_factory(self.target, self.drafter, self.k, self.rollback)
        self._conversation_started(data)
        self.session = self.decoder.start(list(prompt))
        self.ctx = list(prompt)
        type(self).observed_paths[f"prompt:{placement}"] += 1
        type(self).observed_paths[f"rollback:{self.rollback}"] += 1

    def _conversation_started(self, data: Any) -> None:
        """A hook run once the decoder of a new conversation is built (the sampled rounds draw their scheme)."""

    @initialize(data=st.data())
    def start_conversation(self, data: Any) -> None:
        self._start(data, "start_conversation")

    @rule(data=st.data())
    def new_conversation(self, data: Any) -> None:
        """Reset: a new prompt, k and rollback strategy (the target and drafter are reset by ``start``)."""
        self._start(data, "new_conversation")

    # ----------------------------------------------------------------- rounds

    def _planned(self, data: Any) -> PlannedRound:
        if self.k not in self._plans:
            self._plans[self.k] = planned_round(k=self.k)
        planned: PlannedRound = data.draw(self._plans[self.k], label="planned round")
        return planned

    def _draw_budget_and_eos(self, data: Any, *, eos: bool) -> tuple[int, int | None]:
        # "ample" (k + 1 fits one full round exactly) comes first so failures shrink to uncut rounds;
        # "cut" (budget <= k, so k_eff = budget - 1) clamps the draft
        cut = data.draw(st.sampled_from(("ample", "cut")), label="budget kind") == "cut" and self.k > 0
        budget: int = data.draw(
            st.integers(1, self.k) if cut else st.integers(self.k + 1, self.k + 4), label="max_new_tokens"
        )
        eos_id: int | None = None
        if eos:
            upcoming = self._greedy(self.k + 1)
            if upcoming:  # an EOS among the next greedy tokens lands inside the accepted draft
                eos_id = data.draw(st.one_of(st.none(), st.sampled_from(upcoming)), label="eos_token_id")
        return budget, eos_id

    def _run_round(self, label: str, planned: PlannedRound | None, budget: int, eos: int | None) -> list[int]:
        """Run one round through the session, check what it emitted, and advance ``self.ctx``."""
        room = self.max_context - (len(self.ctx) - 1)
        k_eff = max(0, min(self.k, budget - 1, room - 1))
        upcoming = self._greedy(self.k + 1)
        script = None
        if planned is not None:
            script = ScriptedDrafter(self.ctx, upcoming, RoundPlan((planned,)), vocab_size=self.vocab_size)
        self.drafter.script = script
        self.drafter.unscripted_calls.clear()
        self.last_step = f"{label}(planned={planned}, max_new_tokens={budget}, eos_token_id={eos}, k_eff={k_eff})"
        try:
            gen = self.session.generate(budget, eos_token_id=eos, max_rounds=1)
        except Exception as err:
            err.add_note(f"raised by the decoder under test in RollbackMachine rule {self.last_step}")
            raise
        finally:
            self.drafter.script = None
        self.rounds += 1
        draft = list(script.calls[-1][3]) if script is not None and script.calls else []
        got = [int(t) for t in gen.tokens]
        if room < 1:
            expected: list[int] = []
            path = "context_full"
        else:
            j = _matching_prefix(draft, upcoming)
            if j >= len(upcoming):
                self._fail(
                    "stop",
                    f"the engine asked for a draft of {len(draft)} tokens with only {room} free context slots",
                )
            expected, path = _lossless_emission(draft, upcoming, j, budget=budget, eos=eos)
        self.last_step = (
            f"{label}(planned={planned}, max_new_tokens={budget}, eos_token_id={eos}, k_eff={k_eff}; "
            f"draft={draft}, greedy={upcoming[: len(draft) + 1]}, emitted={got})"
        )
        if got != expected:
            self._fail(
                "lossless",
                f"the round emitted {got}; plain greedy continues {upcoming}, so with draft {draft} a lossless "
                f"engine emits {expected}",
            )
        steps = getattr(gen, "steps", None)
        if steps and room >= 1:
            self._check_step(steps[0], draft)
        self.ctx.extend(expected)
        eos_inside = eos is not None and bool(expected) and expected[-1] == eos and len(expected) < len(draft) + 1
        for tag in _round_tags(path, clamped=k_eff < self.k and planned is not None, eos_inside=eos_inside):
            type(self).observed_paths[f"round:{tag}"] += 1
            event(f"RollbackMachine round: {tag}")
        return expected

    @precondition(lambda self: len(self.ctx) <= self.max_context)  # a full context only needs plain_step
    @rule(data=st.data())
    def spec_round(self, data: Any) -> None:
        """One scripted speculative round of a drawn kind, maybe cut by max_new_tokens or an EOS."""
        planned = self._planned(data)
        budget, eos = self._draw_budget_and_eos(data, eos=True)
        self._run_round("spec_round", planned, budget, eos)

    @rule(data=st.data())
    def plain_step(self, data: Any) -> None:
        """A k = 0 round: ``max_new_tokens=1`` leaves no room for a draft, so the engine must not draft."""
        upcoming = self._greedy(1)
        eos = data.draw(st.one_of(st.none(), st.sampled_from(upcoming)), label="eos_token_id") if upcoming else None
        self._run_round("plain_step", None, 1, eos)
        if self.drafter.unscripted_calls and any(k > 0 for k in self.drafter.unscripted_calls):
            self._fail(
                "stop",
                f"with max_new_tokens=1 the engine asked the drafter for k={self.drafter.unscripted_calls} "
                "(a draft token could only pass max_new_tokens)",
            )

    @precondition(lambda self: len(self.ctx) <= self.max_context)
    @rule(data=st.data())
    def snapshot_round_trip(self, data: Any) -> None:
        """Snapshot the target, run a round, restore: the target must be back at the old context.

        Then the round's tokens are re-fed by hand (``target.forward``) so the session and
        the target agree again, and later rounds must still be lossless.
        """
        before = list(self.ctx)
        snap = self.target.snapshot()
        planned = self._planned(data)
        budget, _ = self._draw_budget_and_eos(data, eos=False)
        emitted = self._run_round("snapshot_round_trip", planned, budget, None)
        self.decode_convention_holds()  # the round itself, before the restore
        self.target.restore(snap)
        after = self.ctx
        self.ctx = before
        step = self.last_step
        self.last_step = f"{step}, then target.restore(snapshot taken before the round)"
        self._check_kv_length(before, "processed")
        self._check_state(before, "restore")
        if emitted:
            self.target.forward([before[-1], *emitted[:-1]])
        self.ctx = after
        self.last_step = f"{step}, then restore and re-feed {[before[-1], *emitted[:-1]]}"

    @precondition(lambda self: len(self.ctx) < self.max_context)
    @rule(data=st.data())
    def user_turn(self, data: Any) -> None:
        """``session.extend(tokens)``: a user turn of 1..8 tokens appended to the context."""
        room = self.max_context - len(self.ctx)
        tokens = data.draw(
            contexts(self.vocab_size, min_size=1, max_size=min(8, room), kinds=self.cfg.context_kinds),
            label="user tokens",
        )
        self.last_step = f"user_turn(tokens={_fmt(tokens)})"
        self.session.extend(tokens)
        self.ctx.extend(tokens)
        type(self).observed_paths["user_turn"] += 1


@functools.cache
def _with_sampled_rounds(cls: type[RollbackMachine]) -> type[RollbackMachine]:
    """``cls`` with the sampled-round rule mixed in front (one class per machine class)."""
    return type(f"{cls.__name__}WithSampledRounds", (SampledRounds, cls), {"__module__": cls.__module__})


def run_rollback_machine(
    *,
    target_factory: Callable[[], Any],
    reference_factory: Callable[[], Any] | None = None,
    decoder_factory: DecoderFactory | None = None,
    max_k: int = 8,
    tolerance: float = 0.0,
    rollbacks: Iterable[str] = ROLLBACK_STRATEGIES,
    max_prompt: int = 24,
    context_kinds: Iterable[str] | None = None,
    stateful_step_count: int = 25,
    settings: Settings | None = None,
    sampled_rounds: bool = True,
    tree_rounds: bool = False,
) -> type[RollbackMachine]:
    """Configure a ``RollbackMachine`` and run it with ``hypothesis.stateful.run_state_machine_as_test``.

    ``settings`` defaults to the configured ``TestCase.settings`` (the loaded profile's
    ``max_examples`` and phases minus ``explain``, ``stateful_step_count`` steps). Raises the shrunk failure
    (an ``AssertionError`` naming the invariant) if the implementation is broken;
    returns the configured class (its ``observed_paths`` shows what was exercised). It draws inside
    ``no_local_constants()``: the same examples in every process (docs/contract.md).
    """
    machine = RollbackMachine.configure(
        target_factory=target_factory,
        reference_factory=reference_factory,
        decoder_factory=decoder_factory,
        max_k=max_k,
        tolerance=tolerance,
        rollbacks=rollbacks,
        max_prompt=max_prompt,
        context_kinds=context_kinds,
        stateful_step_count=stateful_step_count,
        sampled_rounds=sampled_rounds,
        tree_rounds=tree_rounds,
    )
    with no_local_constants():  # the same examples in every process, whatever local code it imported
        run_state_machine_as_test(machine, settings=settings or machine.TestCase.settings)
    return machine
