"""``SessionRequests``: ``SessionMachine``'s base, which draws a request, runs it on the one engine and counts it.

A request draws its budget, an EOS (``_draw_eos``) and, where the suite can set the drafter, a drafter
and round plan (``_draw_drafter``); its tokens are judged by ``_SessionRunner``, and a failure raises
the ``SessionFailure`` with the whole session in a note. Which requests a session makes is the rules'
job (``SessionMachine``, ``RelationRules``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Self

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from specproof.contract import DecodeParams
from specproof.contract.errors import InvalidSettingError
from specproof.strategies._contexts import contexts
from specproof.strategies._decode_params import processor_configs
from specproof.strategies._machine import configured_machine
from specproof.strategies._request_relations import RelationTracker
from specproof.strategies._rounds import RoundPlan, round_plans
from specproof.strategies._session_config import _resolve_max_context, _runner, _session_config, _SessionConfig
from specproof.strategies._session_history import DRAFTER_CHOICES, SessionHistory, SessionRequest
from specproof.strategies._session_runner import GreedyOracle, SessionFailure, SetDrafter, _SessionRunner

#: the ``observed`` tag of a request's relation to the one before (``RELATION_TAG + tag``)
RELATION_TAG = "relation:"
_EXAMPLES = "machine: examples"
#: the ``observed`` tags of a request drawn with decode parameters, and of one whose parameters the engine refused
DECODE_TAG = "decode: requests with processors"
DECODE_REFUSED = "decode: refused by the engine"
_CAN_RESET = "machine: the engine has reset()"

#: the ``observed`` tag of a request whose engine declares a cache but reported no ``prefix_reused``
REUSE_UNREPORTED = "prefix_reused not reported"
# ``observed`` tags of the feature judge: requests with a feature drafter whose features were judged,
# proposals judged, and the requests among them on a prefix the engine reported serving from its caches
_FEATURE_TAGS = ("features judged: requests", "features judged: proposals", "features judged: prefix hits")


def _count_of(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _raise(failure: SessionFailure) -> None:
    history = SessionHistory.from_example(failure.example)
    count = len(history.requests)
    failure.add_note(f"the whole session ({count} requests on one engine instance):\n{history.describe()}")
    raise failure


def _draw_eos(data: Any, continuation: list[int], k: int) -> tuple[int | None, str]:
    """An EOS among greedy's continuation (often in its last ``k + 1`` tokens) or none, and where it was drawn."""
    eos_kind = data.draw(st.sampled_from(("none", "last_k_plus_1", "anywhere", "last_k_plus_1")), label="eos placement")
    if eos_kind == "none" or not continuation:
        return None, eos_kind
    pool = continuation[-(k + 1) :] if eos_kind == "last_k_plus_1" else continuation
    eos: int = data.draw(st.sampled_from(pool), label="eos_token_id")
    return eos, eos_kind


def _draw_decode(data: Any, cfg: _SessionConfig) -> DecodeParams | None:
    """With ``decode_features`` (``--decode-state``), half the time the processors declared, each on (strengths
    drawn); None otherwise. Without them nothing is drawn: the session's draws are as before."""
    if not cfg.decode_features or not data.draw(st.booleans(), label="with decode processors"):
        return None
    params: DecodeParams = data.draw(
        processor_configs(cfg.vocab_size, features=cfg.decode_features, active=True), label="decode processors"
    )
    return params if params.features() else None


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


class SessionRequests(RuleBasedStateMachine):
    """``SessionMachine``'s base: its configuration, its one engine and how a request is drawn, run and counted.

    ``observed`` (per configured class) counts the request kinds, drafter choices and EOS placements
    exercised. The rules that choose the requests are ``SessionMachine``'s (and ``RelationRules``').
    """

    _session_config: ClassVar[_SessionConfig | None] = None
    observed: ClassVar[Counter[str]] = Counter()

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
        decode_features: Iterable[str] = (),
        decode_reference_factory: Callable[[], Any] | None = None,
        name: str | None = None,
    ) -> type[Self]:
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
        ``decode_features`` (``--decode-state``; default none: the draws are unchanged) are the processors
        (penalties, logit_bias, bad_words) half the requests carry, drawn by ``processor_configs``, passed to
        ``generate`` as ``decode=`` and judged against plain decoding with them on a copy of the model from
        ``decode_reference_factory``.
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
            decode_features=decode_features,
            decode_reference_factory=decode_reference_factory,
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
        decode = _draw_decode(data, cfg)
        if decode is None:
            continuation, _ = runner.continuation(prompt, n)
        else:
            self._count(DECODE_TAG)
            continuation = runner.decode.continuation(prompt, n, decode)
        eos, eos_kind = _draw_eos(data, continuation, k)
        if eos is not None:
            self._count(f"eos:{eos_kind}")
        drafted = _draw_drafter(data, runner, k)
        if drafted["drafter"] is not None:
            self._count(f"drafter:{drafted['drafter']}")
        req = SessionRequest(
            kind=kind, prompt=tuple(prompt), max_new_tokens=n, eos_token_id=eos, decode=decode, note=note, **drafted
        )
        self._count(f"request:{kind}")
        unreported, judged, refused = runner.reuse_unreported, runner.features.counts(), len(runner.decode_refused)
        tokens, failure = runner.run(req)
        if len(runner.decode_refused) > refused:
            self._count(DECODE_REFUSED)
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

    def _reset(self) -> None:
        self._count("request:reset")
        _, failure = self.runner.run(SessionRequest(kind="reset"))
        if failure is not None:
            _raise(failure)
        self.relations.reset()
        self.since_cold = 0
