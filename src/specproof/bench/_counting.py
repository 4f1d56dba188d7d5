"""Figures counted at the target, not timed: the same on every machine (what the default gate gates).

``CountingTarget`` records every forward and the weight bytes it read; ``count_greedy`` runs the
greedy oracle on one, ``count_spec`` a speculative conversation as the timed runs decode it. The
measurements (``_speed``, ``_drafters``) build their cells from these.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from specproof.bench._degeneracy import distinct_ngram_share, final_period, is_degenerate
from specproof.contract import Drafter, Target
from specproof.contract.errors import SpecproofError
from specproof.engine import NgramDrafter, SpecDecoder, greedy_decode

__all__ = [
    "CountingTarget",
    "DecoderFactory",
    "GreedyCount",
    "count_greedy",
    "count_spec",
    "default_decoder",
    "degeneracy_figures",
    "greedy_chunk",
    "prefill",
]

DecoderFactory = Callable[..., Any]  # (target, drafter, *, k, rollback) -> an object with start(prompt)


class CountingTarget:
    """Wraps a target and records, per forward, its length and the weight bytes it read.

    Bytes: ``parameter_bytes()['dense']`` plus ``per_expert`` for every expert of every
    MoE layer in ``last_experts_touched`` after that forward; without
    ``parameter_bytes`` every forward counts as 1 (dense units).
    """

    def __init__(self, inner: Target) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.max_context = inner.max_context
        self.name = f"counting({getattr(inner, 'name', type(inner).__name__)})"
        pb = getattr(inner, "parameter_bytes", None)
        info: Mapping[str, int] | None = pb() if callable(pb) else None
        self._dense = float(info["dense"]) if info else 1.0
        self._per_expert = float(info.get("per_expert", 0)) if info else 0.0
        self.log: list[tuple[int, float]] = []  # (tokens in the forward, bytes read)
        if callable(getattr(inner, "forward_with_checkpoints", None)):
            self.forward_with_checkpoints = self._forward_with_checkpoints

    @property
    def processed(self) -> int:
        return self.inner.processed

    def _bytes(self) -> float:
        touched = getattr(self.inner, "last_experts_touched", ())
        return self._dense + self._per_expert * sum(len(s) for s in touched)

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        out = self.inner.forward(tokens)
        self.log.append((len(tokens), self._bytes()))
        return out

    def _forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[np.ndarray, list[object]]:
        out = self.inner.forward_with_checkpoints(tokens)  # type: ignore[attr-defined]
        self.log.append((len(tokens), self._bytes()))
        return out  # type: ignore[no-any-return]

    def snapshot(self) -> object:
        return self.inner.snapshot()

    def restore(self, snapshot: object) -> None:
        self.inner.restore(snapshot)

    def reset(self) -> None:
        self.inner.reset()

    def decode_log(self, prompt_len: int) -> list[tuple[int, float]]:
        """The forwards after prefill (the first forward is prefill when the prompt has > 1 token)."""
        return self.log[1:] if prompt_len > 1 else list(self.log)


def prefill(target: Target, prompt: list[int]) -> None:
    target.reset()
    if len(prompt) > 1:
        target.forward(prompt[:-1])


def greedy_chunk(target: Target, pending: int, n: int) -> tuple[float, list[int]]:
    """Time ``n`` plain greedy steps from the target's state: the leanest loop, no bookkeeping."""
    tok = pending
    out: list[int] = []
    forward = target.forward
    argmax = np.argmax
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(argmax(forward([tok])[0]))
        out.append(tok)
    return time.perf_counter() - t0, out


@attrs.frozen(kw_only=True)
class GreedyCount:
    """The greedy oracle's tokens and the weight bytes its decode forwards read."""

    tokens: tuple[int, ...]
    decode_bytes: float
    one_token_bytes: float


def count_greedy(target: Target, prompt: list[int], n: int) -> GreedyCount:
    """Run the greedy oracle on a counting wrapper of ``target``."""
    counting = CountingTarget(target)
    oracle = greedy_decode(counting, prompt, n)  # type: ignore[arg-type]
    log = counting.decode_log(len(prompt))
    total = sum(b for _, b in log)
    return GreedyCount(tokens=oracle.tokens, decode_bytes=total, one_token_bytes=total / len(log) if log else 1.0)


def count_spec(
    target: Target,
    prompt: list[int],
    greedy: GreedyCount,
    *,
    k: int,
    rollback: str,
    chunks: int,
    chunk_tokens: int,
    drafter_factory: Callable[[], Drafter] = NgramDrafter,
    decoder_factory: DecoderFactory | None = None,
) -> dict[str, Any]:
    """The machine-independent figures of one speculative conversation, counted at the target.

    The conversation is decoded as the timed runs decode it: ``chunks`` calls of
    ``session.generate(chunk_tokens)`` on one session.
    """
    counting = CountingTarget(target)
    make = decoder_factory or default_decoder
    session = make(counting, drafter_factory(), k=k, rollback=rollback).start(prompt)
    tokens: list[int] = []
    rounds = replay = 0
    attempts = [0] * k
    accepts = [0] * k
    for i in range(chunks):
        gen = session.generate(chunk_tokens)
        stats = gen.stats
        if stats is None:
            raise SpecproofError(
                f"bench: the engine (k={k}, rollback={rollback}) returned a Generation without stats in chunk {i}"
            )
        tokens.extend(gen.tokens)
        rounds += stats.rounds
        replay += stats.replay_forwards
        for p, (n_att, n_acc) in enumerate(zip(stats.position_attempts, stats.position_accepts)):
            if p < k:
                attempts[p] += n_att
                accepts[p] += n_acc
    log = counting.decode_log(len(prompt))
    emitted = max(len(tokens), 1)
    n_rounds = max(rounds, 1)
    spec_bytes = sum(b for _, b in log)
    verify_bytes = [b for q, b in log if q > 1]
    return {
        "tokens": tuple(tokens),
        "emitted": len(tokens),
        "rounds": rounds,
        "tokens_per_round": len(tokens) / n_rounds,
        "acceptance_by_position": tuple(a / n if n else 0.0 for a, n in zip(accepts, attempts)),
        "forwards_per_token": len(log) / emitted,
        "forwards_per_round": len(log) / n_rounds,
        "replay_per_round": replay / n_rounds,
        "projected_speedup": greedy.decode_bytes / spec_bytes if spec_bytes else 0.0,
        "spec_bytes": spec_bytes,
        "verify_bytes_ratio": statistics.mean(verify_bytes) / greedy.one_token_bytes if verify_bytes else 1.0,
        "lossless": tuple(tokens) == greedy.tokens,
    }


def degeneracy_figures(tokens: Sequence[int]) -> dict[str, Any]:
    return {
        "distinct_4gram_share": distinct_ngram_share(tokens, 4),
        "final_period": final_period(tokens),
        "degenerate": is_degenerate(tokens),
    }


def default_decoder(target: Target, drafter: Drafter, *, k: int, rollback: str) -> SpecDecoder:
    return SpecDecoder(target, drafter, k=k, rollback=rollback)  # type: ignore[arg-type]
