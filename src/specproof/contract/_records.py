"""The records a generation produces: ``Step`` per round, ``Stats``, ``Generation``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import attrs

from specproof.contract._logprobs import TokenLogprob

__all__ = ["STOP_REASONS", "Generation", "Stats", "Step", "StopReason"]

StopReason = Literal["max_new_tokens", "eos", "stop_sequence", "context_full", "error"]
# "error" appears only on the partial Generation carried by a DecodeError; "stop_sequence" only on a
# request whose DecodeParams name stop sequences (docs/contract.md, "Decode state").
STOP_REASONS: tuple[str, ...] = ("max_new_tokens", "eos", "stop_sequence", "context_full", "error")


def _int_tuple(values: object) -> tuple[int, ...]:
    """Token ids as ints; an id with a fractional part is refused (``int`` would truncate it silently)."""
    given = list(values)  # type: ignore[call-overload]
    out = tuple(int(v) for v in given)
    for i, (v, n) in enumerate(zip(given, out, strict=True)):
        if v != n:
            raise ValueError(f"token {i} is {v!r}, not an integer token id")
    return out


@attrs.frozen(kw_only=True)
class Step:
    """One speculative round.

    ``accepted`` follows the accept rule (``draft[:j] + [argmax[j]]``) before any
    truncation at EOS or ``max_new_tokens``; ``processed`` is the target's KV length
    after the round's rollback.
    """

    base: int
    draft: tuple[int, ...] = attrs.field(converter=_int_tuple)
    argmax: tuple[int, ...] = attrs.field(converter=_int_tuple)
    accepted: tuple[int, ...] = attrs.field(converter=_int_tuple)
    processed: int

    def to_json(self) -> dict[str, object]:
        return {
            "base": self.base,
            "draft": list(self.draft),
            "argmax": list(self.argmax),
            "accepted": list(self.accepted),
            "processed": self.processed,
        }


@attrs.frozen(kw_only=True)
class Stats:
    """Counts for one generation.

    ``position_attempts[p]`` counts rounds whose draft had a token at position ``p``;
    ``position_accepts[p]`` those where it was accepted. ``prefix_reused``: prompt tokens an
    engine that keeps caches between requests served from them instead of prefilling (``None``:
    the engine does not say; docs/contract.md, "Sessions").
    """

    rounds: int = 0
    emitted: int = 0
    prefill_forwards: int = 0
    verify_forwards: int = 0
    replay_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    position_attempts: tuple[int, ...] = ()
    position_accepts: tuple[int, ...] = ()
    prefix_reused: int | None = None

    @property
    def target_forwards(self) -> int:
        return self.prefill_forwards + self.verify_forwards + self.replay_forwards

    @property
    def decode_forwards(self) -> int:
        """Forwards after prefill: what the cost model charges per emitted token."""
        return self.verify_forwards + self.replay_forwards

    @property
    def mean_tokens_per_round(self) -> float:
        return self.emitted / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        return tuple(a / n if n else 0.0 for a, n in zip(self.position_accepts, self.position_attempts))

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = attrs.asdict(self)
        data["position_attempts"] = list(self.position_attempts)
        data["position_accepts"] = list(self.position_accepts)
        data["target_forwards"] = self.target_forwards
        data["mean_tokens_per_round"] = self.mean_tokens_per_round
        data["acceptance_by_position"] = list(self.acceptance_by_position)
        return data


def _optional_tuple(values: Iterable[TokenLogprob] | None) -> tuple[TokenLogprob, ...] | None:
    return None if values is None else tuple(values)


@attrs.frozen(kw_only=True)
class Generation:
    """What an engine returns. A black-box engine may leave ``steps`` and ``stats`` as None; ``logprobs``, one
    per token, only where the request asked for them (docs/contract.md, "Decode state")."""

    tokens: tuple[int, ...] = attrs.field(converter=_int_tuple)
    stop_reason: StopReason
    steps: tuple[Step, ...] | None = None
    stats: Stats | None = None
    #: each emitted token's logprob under the target after the decode processors (and its top-n alternatives
    #: where asked), aligned with ``tokens``; None when not asked or the engine gives none (docs/contract.md,
    #: Decode state, Logprobs)
    logprobs: tuple[TokenLogprob, ...] | None = attrs.field(default=None, converter=_optional_tuple)
    #: each prompt token's logprob after the ones before it (the first prompt token has none), before any
    #: processor; None when not asked or the engine gives none (docs/contract.md, Decode state, Prompt logprobs)
    prompt_logprobs: tuple[TokenLogprob, ...] | None = attrs.field(default=None, converter=_optional_tuple)

    def __attrs_post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.tokens):
            raise ValueError(f"Generation.logprobs has {len(self.logprobs)} values for {len(self.tokens)} tokens")
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"Generation.stop_reason={self.stop_reason!r} is not one of {STOP_REASONS}")
