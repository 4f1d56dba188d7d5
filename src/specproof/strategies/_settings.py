"""Engine settings and whole decoding cases.

``EngineSettings``/``engine_settings`` and ``DecodingCase``/``decoding_cases``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from numbers import Integral
from typing import Any

import attrs
from hypothesis import strategies as st

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least, int_at_least_validator
from specproof.engine import ROLLBACK_STRATEGIES, SpecDecoder, Target, greedy_decode
from specproof.strategies._contexts import CONTEXT_KINDS, StrategyArgumentError, check_kinds, contexts
from specproof.strategies._rounds import RoundPlan, ScriptedDrafter, round_plans

__all__ = ["DecodingCase", "EngineSettings", "decoding_cases", "engine_settings"]

PROMPT_PLACEMENTS: tuple[str, ...] = ("ordinary", "near_max_context")


def _check_eos(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0):
        raise InvalidSettingError(f"EngineSettings.eos_token_id={value!r} must be None or a token id >= 0")


def _check_rollback(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in ROLLBACK_STRATEGIES:
        raise InvalidSettingError(f"EngineSettings.rollback={value!r} is not one of {ROLLBACK_STRATEGIES}")


@attrs.frozen(kw_only=True)
class EngineSettings:
    """What one generation is run with: draft budget ``k``, ``max_new_tokens``, EOS id and rollback strategy."""

    k: int = attrs.field(validator=int_at_least_validator(0))
    max_new_tokens: int = attrs.field(validator=int_at_least_validator(0))
    eos_token_id: int | None = attrs.field(default=None, validator=_check_eos)
    rollback: str = attrs.field(default="checkpoint", validator=_check_rollback)

    def decoder(self, target: Target, drafter: object) -> SpecDecoder:
        """The reference ``SpecDecoder`` for these settings."""
        return SpecDecoder(target, drafter, k=self.k, rollback=self.rollback)  # type: ignore[arg-type]

    def describe(self) -> str:
        return (
            f"k={self.k} max_new_tokens={self.max_new_tokens} eos_token_id={self.eos_token_id} rollback={self.rollback}"
        )


def _as_int_strategy(value: object, name: str, where: str, minimum: int) -> st.SearchStrategy[int]:
    if isinstance(value, st.SearchStrategy):
        return value
    return st.just(int_at_least(value, name=name, minimum=minimum, where=where, error=StrategyArgumentError))


def _check_rollbacks(rollbacks: Iterable[str], where: str) -> tuple[str, ...]:
    if isinstance(rollbacks, str):
        raise StrategyArgumentError(f"{where}: rollbacks={rollbacks!r} must be a collection of names, not a string")
    chosen = tuple(rollbacks)
    if not chosen:
        raise StrategyArgumentError(f"{where}: rollbacks=() selects nothing; known: {', '.join(ROLLBACK_STRATEGIES)}")
    for name in chosen:
        if name not in ROLLBACK_STRATEGIES:
            raise StrategyArgumentError(f"{where}: unknown rollback {name!r}; known: {', '.join(ROLLBACK_STRATEGIES)}")
    return tuple(dict.fromkeys(chosen))


def engine_settings(
    *,
    max_k: int = 8,
    max_new_tokens: int | st.SearchStrategy[int] | None = None,
    eos_candidates: Sequence[int] | None = None,
    vocab_size: int | None = None,
    rollbacks: Iterable[str] = ROLLBACK_STRATEGIES,
) -> st.SearchStrategy[EngineSettings]:
    """``EngineSettings`` with ``k`` in ``0..max_k``, ``max_new_tokens`` from the given strategy
    (default ``st.integers(1, 48)``, so 1 is included), a rollback from ``rollbacks``, and an EOS
    that is ``None``, one of ``eos_candidates`` (typically tokens of the greedy continuation,
    so the EOS lands inside an accepted draft) or, when ``vocab_size`` is given, any id.

    Shrinks toward ``k = 0``, the smallest ``max_new_tokens``, no EOS and the first rollback.
    """
    where = "engine_settings()"
    max_k = int_at_least(max_k, name="max_k", minimum=0, where=where, error=StrategyArgumentError)
    new_tokens = st.integers(1, 48) if max_new_tokens is None else max_new_tokens
    new_tokens = _as_int_strategy(new_tokens, "max_new_tokens", where, 0)
    if vocab_size is not None:
        vocab_size = int_at_least(vocab_size, name="vocab_size", minimum=1, where=where, error=StrategyArgumentError)
    candidates: tuple[int, ...] = ()
    if eos_candidates is not None:
        if isinstance(eos_candidates, (str, bytes)):
            raise StrategyArgumentError(f"{where}: eos_candidates must be a sequence of token ids")
        candidates = tuple(dict.fromkeys(eos_candidates))
        for i, tok in enumerate(candidates):
            if isinstance(tok, bool) or not isinstance(tok, Integral) or int(tok) < 0:
                raise StrategyArgumentError(f"{where}: eos_candidates[{i}]={tok!r} is not a token id")
            if vocab_size is not None and int(tok) >= vocab_size:
                raise StrategyArgumentError(f"{where}: eos_candidates[{i}]={tok} is outside [0, {vocab_size})")
        candidates = tuple(int(t) for t in candidates)
    chosen_rollbacks = _check_rollbacks(rollbacks, where)

    eos_options: list[st.SearchStrategy[int | None]] = [st.none()]
    if candidates:
        eos_options.append(st.sampled_from(candidates))
    if vocab_size is not None:
        eos_options.append(st.integers(0, vocab_size - 1))

    @st.composite
    def settings(draw: Any) -> EngineSettings:
        return EngineSettings(
            k=draw(st.integers(0, max_k)),
            max_new_tokens=draw(new_tokens),
            eos_token_id=draw(st.one_of(eos_options)),
            rollback=draw(st.sampled_from(chosen_rollbacks)),
        )

    return settings()


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _truncate(tokens: Sequence[int], max_new_tokens: int, eos: int | None) -> tuple[int, ...]:
    out = list(tokens[:max_new_tokens])
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return tuple(out)


@attrs.frozen(kw_only=True)
class DecodingCase:
    """One generation to run and what it must produce.

    ``continuation`` is the target's plain greedy output after ``prompt`` for
    ``settings.max_new_tokens`` tokens, without EOS (shorter only if the context filled
    up); ``expected_tokens`` applies the EOS. ``placement`` says whether the prompt was
    put near ``max_context`` on purpose so that drafts get clamped.
    """

    prompt: tuple[int, ...] = attrs.field(converter=_int_tuple)
    continuation: tuple[int, ...] = attrs.field(converter=_int_tuple)
    settings: EngineSettings
    plan: RoundPlan
    placement: str = "ordinary"
    max_context: int | None = None

    @property
    def expected_tokens(self) -> tuple[int, ...]:
        """What a lossless engine emits: the continuation cut at ``max_new_tokens`` and after the first EOS."""
        return _truncate(self.continuation, self.settings.max_new_tokens, self.settings.eos_token_id)

    def drafter(self, vocab_size: int) -> ScriptedDrafter:
        """A fresh ``ScriptedDrafter`` following ``plan`` against ``continuation``."""
        return ScriptedDrafter(self.prompt, self.continuation, self.plan, vocab_size=vocab_size)

    def decoder(self, target: Target) -> SpecDecoder:
        """A ``SpecDecoder`` over ``target`` with this case's drafter and settings."""
        return self.settings.decoder(target, self.drafter(target.vocab_size))

    def describe(self) -> str:
        """One line for failure messages."""
        prompt = list(self.prompt)
        shown = f"{prompt}" if len(prompt) <= 12 else f"[{len(prompt)} tokens: {prompt[:6]}...{prompt[-4:]}]"
        near = f" (near max_context={self.max_context})" if self.placement == "near_max_context" else ""
        return (
            f"DecodingCase(prompt={shown}{near}, {self.settings.describe()}, plan={self.plan.describe()}, "
            f"expected={list(self.expected_tokens)})"
        )


def decoding_cases(
    target_factory: Callable[[], Target],
    *,
    max_k: int = 8,
    max_new_tokens: int | st.SearchStrategy[int] | None = None,
    max_prompt: int = 48,
    context_kinds: Iterable[str] | None = None,
    rollbacks: Iterable[str] = ROLLBACK_STRATEGIES,
    placements: Iterable[str] = PROMPT_PLACEMENTS,
    min_rounds: int = 1,
    max_rounds: int = 12,
) -> st.SearchStrategy[DecodingCase]:
    """Whole decoding cases for the target ``target_factory()`` builds.

    Draws a prompt placement from ``placements`` (``PROMPT_PLACEMENTS``): ``ordinary`` is a
    ``contexts`` prompt of up to ``max_prompt`` tokens; ``near_max_context``, a deliberate
    case, is a drawn context tiled to within ``max_k + 1`` tokens of the target's
    ``max_context``, so that drafts get clamped and the context fills. Then it draws
    ``max_new_tokens``, computes the greedy continuation with
    ``specproof.engine.greedy_decode``, draws ``engine_settings`` whose EOS candidates
    are that continuation's tokens, and a ``round_plans`` for the drawn ``k``.

    The target is built once, on the first draw, and reused (``greedy_decode`` resets
    it). Shrinks toward an ordinary short simple prompt, few new tokens, ``k = 0``,
    no EOS and one all-accepted round.
    """
    where = "decoding_cases()"
    if not callable(target_factory):
        raise StrategyArgumentError(f"{where}: target_factory={target_factory!r} must be a callable returning a Target")
    max_k = int_at_least(max_k, name="max_k", minimum=0, where=where, error=StrategyArgumentError)
    max_prompt = int_at_least(max_prompt, name="max_prompt", minimum=1, where=where, error=StrategyArgumentError)
    new_tokens = st.integers(1, 48) if max_new_tokens is None else max_new_tokens
    new_tokens = _as_int_strategy(new_tokens, "max_new_tokens", where, 0)
    kinds = check_kinds(context_kinds, known=CONTEXT_KINDS, where=where)
    chosen_rollbacks = _check_rollbacks(rollbacks, where)
    round_plans(k=0, min_rounds=min_rounds, max_rounds=max_rounds)  # validates the round counts now
    chosen_placements = check_kinds(placements, known=PROMPT_PLACEMENTS, where=where)
    target = _built_once(target_factory, where)

    @st.composite
    def case(draw: Any) -> DecodingCase:
        tgt = target()
        vocab, max_context = int(tgt.vocab_size), int(tgt.max_context)
        placement = draw(st.sampled_from(chosen_placements))
        prompt = _draw_prompt(
            draw, placement, vocab=vocab, max_context=max_context, max_prompt=max_prompt, max_k=max_k, kinds=kinds
        )
        n_new = draw(new_tokens)
        continuation = greedy_decode(tgt, prompt, n_new).tokens
        settings = draw(
            engine_settings(
                max_k=max_k,
                max_new_tokens=n_new,
                eos_candidates=continuation or None,
                vocab_size=vocab,
                rollbacks=chosen_rollbacks,
            )
        )
        plan = draw(round_plans(k=settings.k, min_rounds=min_rounds, max_rounds=max_rounds))
        return DecodingCase(
            prompt=prompt,
            continuation=continuation,
            settings=settings,
            plan=plan,
            placement=placement,
            max_context=max_context,
        )

    return case()


def _built_once(target_factory: Callable[[], Target], where: str) -> Callable[[], Target]:
    """A getter that builds the target on its first call (checking it looks like one) and reuses it after."""
    built: list[Target] = []

    def target() -> Target:
        if not built:
            made = target_factory()
            for attr in ("vocab_size", "max_context", "forward", "reset"):
                if not hasattr(made, attr):
                    raise StrategyArgumentError(f"{where}: target_factory() returned {made!r}, which has no {attr!r}")
            built.append(made)
        return built[0]

    return target


def _draw_prompt(
    draw: Any, placement: str, *, vocab: int, max_context: int, max_prompt: int, max_k: int, kinds: tuple[str, ...]
) -> list[int]:
    """An ``ordinary`` prompt of up to ``max_prompt`` tokens, or (``near_max_context``) a drawn context tiled to
    within ``max_k + 1`` tokens of ``max_context``."""
    if placement == "ordinary":
        prompt: list[int] = draw(contexts(vocab, min_size=1, max_size=min(max_prompt, max_context), kinds=kinds))
        return prompt
    slack = draw(st.integers(0, min(max_k + 1, max_context - 1)))
    seed = draw(contexts(vocab, min_size=1, max_size=min(16, max_context), kinds=kinds))
    length = max_context - slack
    tiled: list[int] = (seed * (length // len(seed) + 1))[:length]
    return tiled
