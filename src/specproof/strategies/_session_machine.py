"""``SessionMachine``: request sequences on one live engine, each compared with plain greedy.

Engines keep caches between ``generate`` calls: prefix caching (a prompt sharing a prefix
with the last context reuses its KV and recurrent state), multi-turn chat (the last
context plus a user turn), "regenerate" (the same prompt again) and edited prompts. A
bug there only shows after the right *sequence* of requests: a rollback across a call
boundary that reaches further back than the snapshots the engine kept restores stale conv
or recurrent state, silently. Every other check builds a fresh engine per example, so it
never sees one.

The machine holds ONE engine instance for a whole run and issues requests to it:

- ``new_prompt``: a prompt from ``contexts`` (sometimes long; sometimes sharing nothing
  with any earlier context);
- ``regenerate``: the last request's prompt again (maybe with another budget and EOS);
- ``edit``: the last context (prompt + output) cut at a drawn point — inside the prompt,
  inside the output, or right at its end — then a diverging suffix;
- ``multi_turn``: the last context plus a user turn (sometimes an earlier context plus
  a turn: a branch);
- ``earlier_prefix``: a prefix of an *earlier* context (most often exactly an earlier
  request's prompt), so the engine must reach further back than the last call's snapshots;
- ``reset``: ``engine.reset()``, where the engine has one (never straight after a cold start,
  and no ``new_prompt`` there either: a one-request session tests what a fresh engine does);
- ``relate``: a request with a drawn relation to the last one (the coverage model of requests,
  ``_request_relations``), one this example has not reached yet while there is one; ``toured()``
  is the machine whose every example starts with a tour of every relation (a regenerate and a
  user turn after ``reset()``, an equal block after a different prefix, early and late edits...):
  the session driver runs one example of it where a run left a relation unreached, so each is
  reached at quick.

Every request's relation to the one before is counted in ``observed`` (``RELATION_TAG``).

Each request draws its ``max_new_tokens`` and an EOS (none, among the greedy
continuation's tokens, or — most often — among its last ``k + 1`` tokens before the
budget, where an EOS lands inside the last accepted block). Where the engine has a
settable ``drafter`` (or the harness passes a ``set_drafter`` hook), the machine draws a
``RoundPlan`` and installs a ``ScriptedDrafter`` for the request, so the engine is driven
down every rollback path on any target. Up to two rules are switched off per run (swarm
testing on top of Hypothesis's own), so each run stresses a different mix.

Where the machine installs the drafter itself and the engine's feature layers are known (its
own drafter is a feature drafter, or ``feature_layers`` is given) with a model to compute
features on (``feature_reference_factory``, default ``reference_factory``), most requests
install it as a *feature* drafter declaring those layers (the request's ``feature_layers``):
the engine must hand it the target's features of exactly ``ctx[:-1]`` at every proposal, on
prefix hits, edits, regenerations and user turns, judged against a fresh copy of the model
fed plain forwards (``FeatureJudge``; the target's own outputs and state are judged first).

Every request's tokens are compared with plain greedy from the oracle, tie-aware
(``compare_lossless``), and its length and stop reason are checked. Given a
``reference_factory`` and an engine whose live ``target`` has ``state_arrays()``, the
target must also hold exactly the context after each request (a stale state that the next
tokens do not reveal — a short conv window refilled, a decaying recurrent state, a zero
budget — shows there). A failure raises a
``SessionFailure`` (``_session_runner``) whose ``example`` holds the whole request history
(``{"history": [...], "failing_request": i}``); certification reports it as a violation of
the session invariant (docs/contract.md). ``SessionHistory`` (``_session_history``) saves it
as a session history file (``specproof.formats.session``), and ``replay_session`` replays it on a fresh engine,
installing the same scripted drafts, so it fails again; ``shrink_history`` shortens it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from numbers import Integral
from typing import Any, ClassVar

import attrs
from hypothesis import event
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least
from specproof.strategies._contexts import CONTEXT_KINDS, StrategyArgumentError, check_kinds, contexts
from specproof.strategies._machine import check_tolerance, configured_machine
from specproof.strategies._request_relations import (
    DESCRIPTIONS,
    RELATIONS,
    RESET_TAGS,
    SESSION_KIND,
    SHARED_BLOCK,
    RelationTracker,
)
from specproof.strategies._rounds import RoundPlan, round_plans
from specproof.strategies._session_history import DRAFTER_CHOICES, SessionHistory, SessionRequest
from specproof.strategies._session_runner import GreedyOracle, SessionFailure, SetDrafter, _SessionRunner

__all__ = ["RELATION_TAG", "REUSE_UNREPORTED", "SessionMachine", "run_session_machine"]

#: the ``observed`` tag of a request's relation to the one before (``RELATION_TAG + tag``)
RELATION_TAG = "relation:"
_EXAMPLES = "machine: examples"
# the order a tour reaches the relations in: an equal block after a different prefix first (right after the
# first request, whose whole prompt the engine prefilled: where block caches take their states), shortening last
_TOUR = (
    "shared_block",
    "continuation",
    "same",
    "extension",
    "edit_late",
    "edit_early",
    "shorter",
    "unrelated",
    "same_after_reset",
    "continuation_after_reset",
)
_CAN_RESET = "machine: the engine has reset()"

#: the ``observed`` tag of a request whose engine declares a cache but reported no ``prefix_reused``
REUSE_UNREPORTED = "prefix_reused not reported"
# ``observed`` tags of the feature judge: requests with a feature drafter whose features were judged,
# proposals judged, and the requests among them on a prefix the engine reported serving from its caches
_FEATURE_TAGS = ("features judged: requests", "features judged: proposals", "features judged: prefix hits")

# Rules a run may switch off (swarm testing: a run with new_prompt and reset off is one long session).
_SWITCHABLE: tuple[str, ...] = (
    "branch_back",
    "relate",
    "new_prompt",
    "regenerate",
    "edit",
    "multi_turn",
    "earlier_prefix",
    "reset",
)


def _count_of(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _raise(failure: SessionFailure) -> None:
    history = SessionHistory.from_example(failure.example)
    count = len(history.requests)
    failure.add_note(f"the whole session ({count} requests on one engine instance):\n{history.describe()}")
    raise failure


@attrs.frozen(kw_only=True)
class _SessionConfig:
    engine_factory: Callable[[], Any]
    greedy: GreedyOracle
    vocab_size: int
    max_context: int | None
    tie_tolerance: float
    max_prompt: int
    max_new_tokens: int
    set_drafter: SetDrafter | None
    context_kinds: tuple[str, ...]
    reference_factory: Callable[[], Any] | None
    atol: float
    feature_layers: tuple[int, ...] | None = None
    feature_reference_factory: Callable[[], Any] | None = None
    # greedy continuations by prompt, shared by every example of the configured class (shrinking
    # replays the same prompts hundreds of times); the oracle is deterministic, so this is safe
    greedy_memo: dict[tuple[int, ...], tuple[int, list[int], list[float] | None]] = attrs.field(
        factory=dict, eq=False, repr=False
    )


def _session_config(
    *,
    engine_factory: Callable[[], Any],
    greedy: GreedyOracle,
    vocab_size: int,
    max_context: int | None,
    tie_tolerance: float,
    max_prompt: int,
    max_new_tokens: int,
    set_drafter: SetDrafter | None,
    context_kinds: Iterable[str] | None,
    stateful_step_count: int,
    reference_factory: Callable[[], Any] | None,
    atol: float,
    feature_layers: Iterable[int] | None = None,
    feature_reference_factory: Callable[[], Any] | None = None,
) -> _SessionConfig:
    """``SessionMachine.configure``'s options validated (``StrategyArgumentError`` naming the bad one)."""
    where = "SessionMachine.configure()"
    if not callable(engine_factory):
        raise StrategyArgumentError(f"{where}: engine_factory={engine_factory!r} must be callable")
    if not callable(greedy):
        raise StrategyArgumentError(
            f"{where}: greedy={greedy!r} must be callable (prompt, n, eos) -> (tokens, margins)"
        )
    if set_drafter is not None and not callable(set_drafter):
        raise StrategyArgumentError(f"{where}: set_drafter={set_drafter!r} must be callable or None")
    if reference_factory is not None and not callable(reference_factory):
        raise StrategyArgumentError(f"{where}: reference_factory={reference_factory!r} must be callable or None")
    if feature_reference_factory is not None and not callable(feature_reference_factory):
        raise StrategyArgumentError(
            f"{where}: feature_reference_factory={feature_reference_factory!r} must be callable or None"
        )
    layers = _check_layers(feature_layers, where=where)
    for opt, value, minimum in (
        ("vocab_size", vocab_size, 2),
        ("max_prompt", max_prompt, 1),
        ("max_new_tokens", max_new_tokens, 1),
        ("stateful_step_count", stateful_step_count, 1),
    ):
        int_at_least(value, name=opt, minimum=minimum, where=where, error=StrategyArgumentError)
    if max_context is not None:
        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < max_new_tokens + 2:
            raise StrategyArgumentError(
                f"{where}: max_context={max_context!r} must be an integer >= max_new_tokens + 2 "
                f"= {max_new_tokens + 2} (room for a two-token prompt and the budget), or None"
            )
    return _SessionConfig(
        engine_factory=engine_factory,
        greedy=greedy,
        vocab_size=vocab_size,
        max_context=max_context,
        tie_tolerance=check_tolerance(tie_tolerance, where=where, name="tie_tolerance"),
        max_prompt=max_prompt,
        max_new_tokens=max_new_tokens,
        set_drafter=set_drafter,
        context_kinds=check_kinds(context_kinds, known=CONTEXT_KINDS, where=where),
        reference_factory=reference_factory,
        atol=check_tolerance(atol, where=where, name="atol"),
        feature_layers=layers,
        feature_reference_factory=feature_reference_factory or reference_factory,
    )


def _check_layers(value: Iterable[int] | None, *, where: str) -> tuple[int, ...] | None:
    """``feature_layers`` as a tuple of distinct non-negative layer indices, or None."""
    if value is None:
        return None
    try:
        layers = tuple(value)
    except TypeError:
        raise StrategyArgumentError(
            f"{where}: feature_layers={value!r} must be a sequence of layer indices or None"
        ) from None
    if not layers or any(isinstance(x, bool) or not isinstance(x, Integral) or int(x) < 0 for x in layers):
        raise StrategyArgumentError(
            f"{where}: feature_layers={value!r} must be a non-empty sequence of layer indices (integers >= 0)"
        )
    if len(set(layers)) != len(layers):
        raise StrategyArgumentError(f"{where}: feature_layers={value!r} names a layer twice")
    return tuple(int(x) for x in layers)


def _resolve_max_context(cfg: _SessionConfig, engine: Any) -> int:
    """The configured ``max_context``, else the engine's, else room for four prompts and a budget."""
    max_context = cfg.max_context
    if max_context is None:
        own = getattr(engine, "max_context", None)
        max_context = int(own) if isinstance(own, Integral) and not isinstance(own, bool) else None
    if max_context is None:
        max_context = 4 * cfg.max_prompt + cfg.max_new_tokens
    if max_context < cfg.max_new_tokens + 2:
        raise InvalidSettingError(
            f"SessionMachine: max_context={max_context} leaves no room for a prompt of two tokens and "
            f"max_new_tokens={cfg.max_new_tokens}"
        )
    return max_context


def _runner(cfg: _SessionConfig, engine: Any) -> _SessionRunner:
    """The runner of one machine run: ``engine`` judged as ``cfg`` says."""
    return _SessionRunner(
        engine,
        greedy=cfg.greedy,
        vocab_size=cfg.vocab_size,
        tie_tolerance=cfg.tie_tolerance,
        set_drafter=cfg.set_drafter,
        memo=cfg.greedy_memo,
        ask_at_least=cfg.max_new_tokens,
        reference=None if cfg.reference_factory is None else cfg.reference_factory(),
        atol=cfg.atol,
        feature_layers=cfg.feature_layers,
        feature_reference=cfg.feature_reference_factory,
    )


def _draw_eos(data: Any, continuation: list[int], k: int) -> tuple[int | None, str]:
    """An EOS among greedy's continuation (often in its last ``k + 1`` tokens) or none, and where it was drawn."""
    eos_kind = data.draw(st.sampled_from(("none", "last_k_plus_1", "anywhere", "last_k_plus_1")), label="eos placement")
    if eos_kind == "none" or not continuation:
        return None, eos_kind
    pool = continuation[-(k + 1) :] if eos_kind == "last_k_plus_1" else continuation
    eos: int = data.draw(st.sampled_from(pool), label="eos_token_id")
    return eos, eos_kind


def _draw_drafter(data: Any, runner: _SessionRunner, k: int) -> dict[str, Any]:
    """Where the suite can set the drafter: the drafter choice, for a scripted one its round plan, and
    (where features can be judged; two requests in three) the feature layers it declares."""
    if not runner.settable:
        return {"drafter": None, "plan": None, "feature_layers": None}
    drafter = "scripted"
    if runner.can_choose_own:
        drafter = data.draw(st.sampled_from(DRAFTER_CHOICES), label="drafter")
    plan: tuple[tuple[int, int], ...] | None = None
    if drafter == "scripted":
        drawn: RoundPlan = data.draw(round_plans(k=k, max_rounds=6), label="round plan")
        plan = tuple((r.draft_length, r.correct) for r in drawn.rounds)
    layers = None
    if runner.judges_features and data.draw(st.sampled_from((True, True, False)), label="feature drafter"):
        layers = runner.features.layers
    return {"drafter": drafter, "plan": plan, "feature_layers": layers}


def _draw_turn(data: Any, cfg: _SessionConfig, *, room: int) -> list[int]:
    """A user turn of 1..8 tokens (at most ``room``)."""
    turn = data.draw(
        contexts(cfg.vocab_size, min_size=1, max_size=min(8, room), kinds=cfg.context_kinds), label="user turn"
    )
    return [int(t) for t in turn]


def _switched_on(name: str) -> Callable[[SessionMachine], bool]:
    return lambda self: name not in self.disabled


class SessionMachine(RuleBasedStateMachine):
    """Requests on one live engine, each compared with plain greedy (abstract: use ``configure``).

    See the module docstring for the rules. ``observed`` (per configured class) counts
    the request kinds, drafter choices and EOS placements exercised.
    """

    _session_config: ClassVar[_SessionConfig | None] = None
    observed: ClassVar[Counter[str]] = Counter()
    #: every example starts with a tour of the relations (``toured()``)
    force_tour: ClassVar[bool] = False

    @classmethod
    def configure(
        cls,
        *,
        engine_factory: Callable[[], Any],
        greedy: GreedyOracle,
        vocab_size: int,
        max_context: int | None = None,
        tie_tolerance: float = 0.0,
        max_prompt: int = 32,
        max_new_tokens: int = 12,
        set_drafter: SetDrafter | None = None,
        context_kinds: Iterable[str] | None = None,
        stateful_step_count: int = 10,
        reference_factory: Callable[[], Any] | None = None,
        atol: float = 0.0,
        feature_layers: Iterable[int] | None = None,
        feature_reference_factory: Callable[[], Any] | None = None,
        name: str | None = None,
    ) -> type[SessionMachine]:
        """A runnable subclass for one engine under test.

        ``engine_factory()`` builds the engine (once per run: the whole run is one
        session); ``greedy(prompt, n, eos)`` is the plain-greedy oracle (``target_greedy``
        over a fresh target, or ``engine_greedy`` over a second engine); ``max_context``
        defaults to the engine's ``max_context`` (prompts stay within
        ``max_context - max_new_tokens``); ``set_drafter(engine, prompt, continuation, plan)``
        installs a scripted drafter where setting ``engine.drafter`` is not the way.
        ``reference_factory()`` (optional) builds a fresh Target of the same model: where the
        engine exposes its live ``target`` with ``state_arrays()``, the target must hold
        exactly the context after every request (``processed == len(ctx) - 1`` and the state
        arrays of a reference fed ``ctx[:-1]``, bitwise or within ``atol``).
        ``feature_layers`` (default: the layers the engine's own drafter declares, if any) and
        ``feature_reference_factory`` (default: ``reference_factory``) let requests install a
        feature drafter whose handed features are judged at every proposal (the module docstring).
        """
        config = _session_config(
            engine_factory=engine_factory,
            greedy=greedy,
            vocab_size=vocab_size,
            max_context=max_context,
            tie_tolerance=tie_tolerance,
            max_prompt=max_prompt,
            max_new_tokens=max_new_tokens,
            set_drafter=set_drafter,
            context_kinds=context_kinds,
            stateful_step_count=stateful_step_count,
            reference_factory=reference_factory,
            atol=atol,
            feature_layers=feature_layers,
            feature_reference_factory=feature_reference_factory,
        )
        return configured_machine(
            cls,
            name or f"{cls.__name__}For_{getattr(engine_factory, '__name__', 'engine')}",
            {"_session_config": config, "observed": Counter()},
            stateful_step_count=stateful_step_count,
        )

    @classmethod
    def features_judged(cls) -> tuple[int, int, int]:
        """(requests whose feature drafter's features were judged, proposals judged, those requests on a prefix hit)."""
        return tuple(cls.observed[tag] for tag in _FEATURE_TAGS)  # type: ignore[return-value]

    # ----------------------------------------------------------------- set-up

    def __init__(self) -> None:
        super().__init__()
        cfg = type(self)._session_config
        if cfg is None:
            raise InvalidSettingError(
                "SessionMachine is a base class: build a runnable machine with "
                "SessionMachine.configure(engine_factory=..., greedy=..., vocab_size=...) (or run_session_machine)"
            )
        self.cfg = cfg
        engine = cfg.engine_factory()
        engine_vocab = getattr(engine, "vocab_size", cfg.vocab_size)
        if int(engine_vocab) != cfg.vocab_size:
            raise InvalidSettingError(
                f"SessionMachine: the engine has vocab_size={engine_vocab}; the machine was configured with "
                f"{cfg.vocab_size}"
            )
        max_context = _resolve_max_context(cfg, engine)
        self.prompt_limit = max_context - cfg.max_new_tokens  # every prompt fits with its whole budget
        self.runner = _runner(cfg, engine)
        # (observed is shared with subclasses: what applies is kept there, not in a class attribute)
        type(self).observed[_EXAMPLES] += 1
        type(self).observed[_CAN_RESET] = int(self.runner.can_reset)
        self.disabled: frozenset[str] = frozenset()
        self.contexts: list[list[int]] = []  # every context (prompt + output) so far, oldest first
        self.prompt_lengths: list[int] = []  # the prompt length of each context
        self.since_cold = 0  # requests since the last reset or unrelated prompt
        self.last_prompt: list[int] = []
        self.relations = RelationTracker()  # each request's relation to the one before

    # ----------------------------------------------------------------- requests

    def _count(self, tag: str) -> None:
        type(self).observed[tag] += 1
        event(f"SessionMachine: {tag}")

    def _request(self, data: Any, kind: str, prompt: list[int], note: str) -> None:
        cfg = self.cfg
        runner = self.runner
        k = runner.plan_k
        # "max" first: failures shrink toward the full budget; "zero" positions the cache and emits nothing
        budget_kind = data.draw(st.sampled_from(("max", "any", "max", "any", "max", "zero")), label="budget kind")
        n = {"max": cfg.max_new_tokens, "zero": 0}.get(budget_kind)
        if n is None:
            n = data.draw(st.integers(1, cfg.max_new_tokens), label="max_new_tokens")
        continuation, _ = runner.continuation(prompt, n)
        eos, eos_kind = _draw_eos(data, continuation, k)
        if eos is not None:
            self._count(f"eos:{eos_kind}")
        drafted = _draw_drafter(data, runner, k)
        if drafted["drafter"] is not None:
            self._count(f"drafter:{drafted['drafter']}")
        req = SessionRequest(kind=kind, prompt=tuple(prompt), max_new_tokens=n, eos_token_id=eos, note=note, **drafted)
        self._count(f"request:{kind}")
        unreported, judged = runner.reuse_unreported, runner.features.counts()
        tokens, failure = runner.run(req)
        if runner.reuse_unreported > unreported:
            self._count(REUSE_UNREPORTED)
        for tag, was, now in zip(_FEATURE_TAGS, judged, runner.features.counts(), strict=True):
            type(self).observed[tag] += now - was
        if failure is not None:
            _raise(failure)
        for tag in self.relations.call(prompt, tokens):
            type(self).observed[RELATION_TAG + tag] += 1
        self.contexts.append([*prompt, *tokens])
        self.prompt_lengths.append(len(prompt))
        self.last_prompt = list(prompt)
        self.since_cold += 1

    def _fresh_prompt(self, data: Any) -> tuple[list[int], str]:
        cfg = self.cfg
        top = min(cfg.max_prompt, self.prompt_limit)
        shape = data.draw(st.sampled_from(("ordinary", "long", "unrelated")), label="prompt shape")
        low = max(1, top // 2) if shape == "long" else 1
        prompt = data.draw(
            contexts(cfg.vocab_size, min_size=low, max_size=top, kinds=cfg.context_kinds), label="prompt"
        )
        prompt = [int(t) for t in prompt]
        if shape == "unrelated":
            # share nothing with any earlier context: a first token none of them starts with, if there is one
            firsts = {c[0] for c in self.contexts if c}
            free = [t for t in range(cfg.vocab_size) if t not in firsts]
            if free and prompt[0] in firsts:
                prompt[0] = free[prompt[0] % len(free)]
        return prompt, f"a new prompt ({shape}, {_count_of(len(prompt), 'token')})"

    @initialize(data=st.data())
    def first_request(self, data: Any) -> None:
        """Draw which rules this run uses (swarm testing), then the session's first prompt."""
        # at most two rules off: a run left with one rule (only regenerate, only new prompts) tests little
        off = data.draw(st.sets(st.sampled_from(_SWITCHABLE), max_size=0), label="rules off")
        self.disabled = frozenset(off)
        prompt, note = self._fresh_prompt(data)
        self._request(data, "new_prompt", prompt, note)
        # a tour of every relation in every example of a machine that forces it (``toured()``: what the
        # certificate's coverage falls back on); otherwise the relate rule draws them
        if self.force_tour:
            for relation in self._missing():
                self._relate(data, relation)

    # not straight after a cold start either: sessions of a single request test nothing a fresh engine does not
    @precondition(lambda self: "new_prompt" not in self.disabled and self.since_cold >= 2)
    @rule(data=st.data())
    def new_prompt(self, data: Any) -> None:
        """A new prompt: ordinary, long, or sharing nothing with any earlier context."""
        prompt, note = self._fresh_prompt(data)
        self.since_cold = 0
        self._request(data, "new_prompt", prompt, note)

    @precondition(_switched_on("regenerate"))
    @rule(data=st.data())
    def regenerate(self, data: Any) -> None:
        """The last request's prompt again (its budget and EOS drawn afresh)."""
        self._request(data, "regenerate", list(self.last_prompt), "the previous prompt again")

    @precondition(_switched_on("edit"))
    @rule(data=st.data())
    def edit(self, data: Any) -> None:
        """The last context cut at a drawn point (in the prompt, in the output, at its end), then a new suffix."""
        base = self.contexts[-1]
        prompt_len = len(self.last_prompt)
        cap = self.prompt_limit - 1  # room for at least one suffix token
        where = data.draw(
            st.sampled_from(("inside_output", "output_end", "inside_prompt", "anywhere")), label="edit point kind"
        )
        if where == "inside_output" and len(base) > prompt_len:
            lo, hi = prompt_len, len(base) - 1
        elif where == "output_end":
            lo = hi = len(base)
        elif where == "inside_prompt":
            lo, hi = 1, max(1, prompt_len - 1)
        else:
            lo, hi = 1, len(base)
        hi = min(hi, cap)
        lo = min(lo, hi)
        cut = data.draw(st.integers(lo, hi), label="edit point")
        room = self.prompt_limit - cut
        suffix = data.draw(
            contexts(self.cfg.vocab_size, min_size=1, max_size=min(8, room), kinds=self.cfg.context_kinds),
            label="new suffix",
        )
        suffix = [int(t) for t in suffix]
        if cut < len(base) and suffix[0] == base[cut]:
            suffix[0] = (suffix[0] + 1) % self.cfg.vocab_size  # diverge right at the edit point
        prompt = [*base[:cut], *suffix]
        self._count(f"edit:{where}")
        note = f"the last context ({prompt_len} prompt + {len(base) - prompt_len} output tokens) cut at {cut} ({where})"
        self._request(data, "edit", prompt, note + f", then {_count_of(len(suffix), 'new token')}")

    # Named to sort first: Hypothesis lists rules alphabetically and its simplest program repeats
    # the first, so even the first (simplest) example of a run crosses two call boundaries.
    @precondition(lambda self: "branch_back" not in self.disabled and len(self.contexts[-1]) < self.prompt_limit)
    @rule(data=st.data())
    def branch_back(self, data: Any) -> None:
        """A user turn on the last context, then the prompt before it again: back across two call boundaries.

        What a chat user does who goes on, then returns to regenerate the earlier answer;
        the engine needs the state it had at the end of that earlier prompt, two requests back.
        """
        before = list(self.last_prompt)
        base = self.contexts[-1]
        turn = _draw_turn(data, self.cfg, room=self.prompt_limit - len(base))
        prompt = [*base, *turn]
        self._request(data, "multi_turn", prompt, f"the last context ({len(base)} tokens) + a {len(turn)}-token turn")
        self._count("branch_back")
        self._request(data, "earlier_prefix", before, "back to the prompt before that turn (two calls back)")

    def _fits_a_turn(self) -> bool:
        return any(len(c) < self.prompt_limit for c in self.contexts)

    @precondition(lambda self: "multi_turn" not in self.disabled and self._fits_a_turn())
    @rule(data=st.data())
    def multi_turn(self, data: Any) -> None:
        """A context (prompt + output) and a user turn of 1..8 tokens.

        Usually the last context; sometimes an earlier one (a branch: the user goes back and
        writes another turn there), which reaches behind the last call's snapshots.
        """
        fits = [i for i, c in enumerate(self.contexts) if len(c) < self.prompt_limit]
        last = len(self.contexts) - 1
        which = "last" if last in fits else "earlier"
        if which == "last" and len(fits) > 1:
            which = data.draw(st.sampled_from(("last", "earlier")), label="turn on which context")
        if which == "earlier":
            earlier = [i for i in fits if i != last]
            back = data.draw(st.sampled_from(earlier[::-1]), label="earlier context (latest first)")
        else:
            back = last
        base = self.contexts[back]
        turn = _draw_turn(data, self.cfg, room=self.prompt_limit - len(base))
        prompt = [*base, *turn]
        self._count(f"multi_turn:{which}")
        where = "the last context" if back == last else f"context {back} of {len(self.contexts)}"
        self._request(data, "multi_turn", prompt, f"{where} ({len(base)} tokens) + a {len(turn)}-token turn")

    @precondition(_switched_on("earlier_prefix"))
    @rule(data=st.data())
    def earlier_prefix(self, data: Any) -> None:
        """A prefix of an earlier context: a rollback past the last call's snapshots.

        Most often exactly an earlier request's prompt (a user going back to regenerate an
        older turn: the engine's snapshot from that call is the one it needs), else a drawn cut.
        """
        # the context before the last one is where a rollback crosses two call boundaries
        which = "any"
        if len(self.contexts) >= 2:
            which = data.draw(st.sampled_from(("any", "before_last")), label="which context")
        if which == "before_last":
            back = len(self.contexts) - 2
        else:
            back = data.draw(st.integers(0, len(self.contexts) - 1), label="which earlier context (0 = oldest)")
        ctx = self.contexts[back]
        where = data.draw(st.sampled_from(("its_prompt", "anywhere", "its_prompt")), label="prefix kind")
        if where == "its_prompt" and self.prompt_lengths[back] <= self.prompt_limit:
            cut = self.prompt_lengths[back]
        else:
            cut = data.draw(st.integers(1, min(len(ctx), self.prompt_limit)), label="prefix length")
        self._count(f"earlier_prefix:{where}")
        note = f"the first {cut} tokens of context {back} of {len(self.contexts)} ({len(ctx)} tokens; {where})"
        self._request(data, "earlier_prefix", ctx[:cut], note)

    # not straight after a cold start: a reset there tests nothing a fresh engine does not
    @precondition(lambda self: "reset" not in self.disabled and self.runner.can_reset and self.since_cold >= 2)
    @rule()
    def reset(self) -> None:
        """``engine.reset()``: the engine must forget its caches (the next request starts cold)."""
        self._reset()

    def _reset(self) -> None:
        self._count("request:reset")
        _, failure = self.runner.run(SessionRequest(kind="reset"))
        if failure is not None:
            _raise(failure)
        self.relations.reset()
        self.since_cold = 0

    # ----------------------------------------------------------------- relations

    @classmethod
    def toured(cls) -> type[SessionMachine]:
        """This machine with a tour of every relation at the start of every example (sharing ``observed``):
        run for one example where a run left a relation unreached. It carries its own copy of the
        configuration (made before the run: ``release_machine`` drops the run's when it is over)."""
        own = {"_session_config": cls._session_config, "_config_names": ("_session_config",)}
        return type(f"{cls.__name__}Toured", (cls,), {"force_tour": True, **own})

    @staticmethod
    def applicable_relations(can_reset: bool) -> tuple[str, ...]:
        """The relations a run must reach: every one, and those after ``reset()`` where the engine has one."""
        return (*RELATIONS, *(RESET_TAGS if can_reset else ()))

    @classmethod
    def relations_reached(cls) -> dict[str, int]:
        """The requests of this run by relation to the one before, every applicable relation listed (0 = never
        reached); empty when no example ran."""
        if not cls.observed[_EXAMPLES]:
            return {}
        return {
            tag: cls.observed[RELATION_TAG + tag] for tag in cls.applicable_relations(bool(cls.observed[_CAN_RESET]))
        }

    def _missing(self) -> list[str]:
        """The relations (and after-reset ones) this example has not reached yet, in tour order.

        Per example, never per run: what an example draws must not depend on the examples before it
        (Hypothesis replays an example and expects the same draws)."""
        seen = self.relations.counts
        wanted = set(self.applicable_relations(self.runner.can_reset))
        return [tag for tag in _TOUR if tag in wanted and not seen[tag]]

    def _related_prompt(self, data: Any, relation: str) -> list[int] | None:
        """A prompt with ``relation`` to the last request (its prompt, and its context: prompt + output),
        within the prompt limit; None where the last request leaves no room for it."""
        cfg, limit = self.cfg, self.prompt_limit
        prompt, ctx = self.last_prompt, self.contexts[-1]
        g, output = len(prompt), ctx[len(prompt) :]
        relation = relation.removesuffix("_after_reset")
        vocab = cfg.vocab_size
        if relation == "same":
            return list(prompt)
        if relation == "extension" and output and g < limit:
            m = data.draw(st.integers(1, min(len(output), limit - g)), label="generated tokens kept")
            return [*prompt, *output[:m]]
        if relation == "continuation" and len(ctx) < limit:
            return [*ctx, *_draw_turn(data, cfg, room=limit - len(ctx))]
        if relation in ("edit_early", "edit_late") and g >= (3 if relation == "edit_early" else 2):
            lo, hi = (1, (g - 1) // 2) if relation == "edit_early" else ((g + 1) // 2, min(g - 1, limit - 1))
            if lo > hi:
                return None
            cut = data.draw(st.integers(lo, hi), label="edit point")
            suffix = _draw_turn(data, cfg, room=min(3, limit - cut))
            suffix[0] = (prompt[cut] + 1) % vocab if suffix[0] == prompt[cut] else suffix[0]
            return [*prompt[:cut], *suffix]
        if relation == "shorter" and g >= 2:
            return list(prompt[: data.draw(st.integers(1, g - 1), label="prefix length")])
        if relation == "shared_block" and min(len(ctx), limit) >= SHARED_BLOCK + 1:
            # the block from the prompt (what the engine prefilled) where it holds two, else from the whole context
            end = min(g if g >= 2 * SHARED_BLOCK + 1 else len(ctx), limit)
            # most often a prefix of whole blocks, so the shared block is aligned as block caches key theirs
            aligned = list(range(SHARED_BLOCK, end - SHARED_BLOCK + 1, SHARED_BLOCK))
            if aligned and data.draw(st.sampled_from((True, True, False)), label="block-aligned shared block"):
                split = data.draw(st.sampled_from(aligned), label="different prefix length")
            else:
                split = data.draw(st.integers(1, end - SHARED_BLOCK), label="different prefix length")
            head = [(t + 1 + data.draw(st.integers(0, vocab - 2), label="token shift")) % vocab for t in ctx[:1]]
            head += [(t + 1) % vocab for t in ctx[1:split]]
            return [*head, *ctx[split:end]]
        if relation == "unrelated":
            fresh, _ = self._fresh_prompt(data)
            return fresh if fresh[0] != ctx[0] else [(fresh[0] + 1) % vocab, *fresh[1:]]
        return None

    def _long_prompt(self, data: Any) -> None:
        """A new prompt of at least two blocks and a token (where the limits allow), sharing no first token."""
        cfg = self.cfg
        top = min(cfg.max_prompt, self.prompt_limit)
        low = 2 * SHARED_BLOCK + 2
        if top < low:
            return
        prompt = data.draw(
            contexts(cfg.vocab_size, min_size=low, max_size=top, kinds=cfg.context_kinds), label="prompt"
        )
        prompt = [int(t) for t in prompt]
        if prompt[0] == self.contexts[-1][0]:
            prompt[0] = (prompt[0] + 1) % cfg.vocab_size
        self._request(data, "new_prompt", prompt, f"a new prompt of {_count_of(len(prompt), 'token')} (whole blocks)")

    def _relate(self, data: Any, relation: str) -> None:
        """A request whose relation to the last one is ``relation`` (after ``reset()`` for the after-reset ones);
        nothing where the last request leaves no room for it."""
        after_reset = relation.endswith("_after_reset")
        if after_reset and not self.runner.can_reset:
            return
        if relation == "shared_block" and len(self.last_prompt) < 2 * SHARED_BLOCK + 1:
            self._long_prompt(data)  # a prompt the engine prefills whole blocks of, to share one with
        prompt = self._related_prompt(data, relation)
        if prompt is None:
            return
        if after_reset:
            self._reset()
        base = relation.removesuffix("_after_reset")
        self._count(f"relate:{relation}")
        note = DESCRIPTIONS[relation] + f" ({_count_of(len(prompt), 'token')})"
        self._request(data, SESSION_KIND[base], prompt, note)

    @precondition(lambda self: "relate" not in self.disabled)
    @rule(data=st.data())
    def relate(self, data: Any) -> None:
        """A request with a drawn relation to the last one: one this example has not reached yet, while there is one."""
        missing = self._missing()
        pool = missing or [
            r for r in self.applicable_relations(self.runner.can_reset) if r not in ("fresh", "after_reset")
        ]
        self._relate(data, data.draw(st.sampled_from(pool), label="relation to the last request"))


def run_session_machine(
    *,
    engine_factory: Callable[[], Any],
    greedy: GreedyOracle,
    vocab_size: int,
    max_context: int | None = None,
    tie_tolerance: float = 0.0,
    max_prompt: int = 32,
    max_new_tokens: int = 12,
    set_drafter: SetDrafter | None = None,
    context_kinds: Iterable[str] | None = None,
    stateful_step_count: int = 10,
    reference_factory: Callable[[], Any] | None = None,
    atol: float = 0.0,
    feature_layers: Iterable[int] | None = None,
    feature_reference_factory: Callable[[], Any] | None = None,
    settings: Settings | None = None,
) -> type[SessionMachine]:
    """Configure a ``SessionMachine`` and run it (``run_state_machine_as_test``).

    Raises the shrunk failure (a ``SessionFailure`` whose example is the whole history);
    returns the configured class
    (its ``observed`` counts what was exercised).
    """
    machine = SessionMachine.configure(
        engine_factory=engine_factory,
        greedy=greedy,
        vocab_size=vocab_size,
        max_context=max_context,
        tie_tolerance=tie_tolerance,
        max_prompt=max_prompt,
        max_new_tokens=max_new_tokens,
        set_drafter=set_drafter,
        context_kinds=context_kinds,
        stateful_step_count=stateful_step_count,
        reference_factory=reference_factory,
        atol=atol,
        feature_layers=feature_layers,
        feature_reference_factory=feature_reference_factory,
    )
    run_state_machine_as_test(machine, settings=settings or machine.TestCase.settings)
    return machine
