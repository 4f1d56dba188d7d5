"""``SessionMachine.configure``'s options, validated in one place, and what they resolve to on a live engine."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from numbers import Integral
from typing import Any

import attrs

from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least
from specproof.strategies._contexts import CONTEXT_KINDS, StrategyArgumentError, check_kinds
from specproof.strategies._decode_params import PROCESSOR_KINDS as _PROCESSORS
from specproof.strategies._machine import check_tolerance
from specproof.strategies._session_runner import GreedyOracle, SetDrafter, _SessionRunner


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
    # --decode-state: the processors a request may carry (empty: none drawn, the draws unchanged) and the model
    # plain decoding with them runs on
    decode_features: frozenset[str] = frozenset()
    decode_reference_factory: Callable[[], Any] | None = None
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
    decode_features: Iterable[str] = (),
    decode_reference_factory: Callable[[], Any] | None = None,
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
    processors = _check_decode(decode_features, decode_reference_factory, where=where)
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
        decode_features=processors,
        decode_reference_factory=decode_reference_factory,
    )


def _check_decode(features: Iterable[str], reference: Callable[[], Any] | None, *, where: str) -> frozenset[str]:
    """``decode_features`` as a set of processor names (``processor_configs``'), which needs a callable
    ``decode_reference_factory`` (the model plain decoding with them runs on)."""
    if isinstance(features, str):
        raise StrategyArgumentError(f"{where}: decode_features={features!r} must be a collection of names, not a str")
    try:
        names = frozenset(features)
    except TypeError:
        raise StrategyArgumentError(f"{where}: decode_features={features!r} must be a collection of names") from None
    unknown = sorted(str(n) for n in names - _PROCESSORS)
    if unknown:
        raise StrategyArgumentError(
            f"{where}: decode_features names {unknown[0]!r}; the session machine draws {sorted(_PROCESSORS)}"
        )
    if names and (reference is None or not callable(reference)):
        raise StrategyArgumentError(
            f"{where}: decode_features={sorted(names)} needs decode_reference_factory, a callable building a copy "
            f"of the model to decode plainly with (got {reference!r})"
        )
    return names


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
        decode_reference=cfg.decode_reference_factory,
    )
