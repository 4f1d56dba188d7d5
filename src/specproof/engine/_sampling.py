"""The reference engine's sampler: the processed distribution, draws, and the two lossless rules.

This is the engine's own copy of the contract's ``processed_distribution`` (docs/contract.md,
"Sampling"), written separately on purpose: the checks judge the engine with
``specproof.contract.sampling``, and an oracle must not share code with its subject.

Random numbers come from the request's ``numpy.random.Generator`` in a fixed order, so one seed
gives one output: rejection sampling draws one uniform per draft token it tests and one per
token it samples (a residual or the bonus); sample-and-match one per position it samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specproof.contract.sampling import SamplingParams

__all__ = ["draw", "match_accept_tokens", "rejection_accept_tokens", "target_distribution"]


def target_distribution(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """``p`` for one logits row: temperature, top-k, softmax, top-p, min-p, renormalize."""
    logits = np.asarray(row, dtype=np.float64)
    vocab = logits.shape[0]
    if params.temperature == 0.0 or params.top_k == 1:
        one_hot = np.zeros(vocab)
        one_hot[int(np.argmax(logits))] = 1.0
        return one_hot
    scaled = logits / params.temperature
    # rank: larger first; among equals the lower id first (a stable sort of the negated values)
    by_rank = np.argsort(-scaled, kind="stable")
    allowed = np.isfinite(scaled)
    if 0 < params.top_k < vocab:
        allowed[by_rank[params.top_k :]] = False
    weights = np.where(allowed, np.exp(scaled - np.max(scaled[allowed])), 0.0)
    probs = weights / weights.sum()
    if params.top_p < 1.0:
        by_prob = np.argsort(-probs, kind="stable")
        mass_before = np.cumsum(probs[by_prob]) - probs[by_prob]
        probs[by_prob[mass_before >= params.top_p]] = 0.0
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from ``probs`` (inverse CDF on one uniform; never a token of probability 0)."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    token = int(np.searchsorted(cdf, u, side="right"))
    token = min(token, len(probs) - 1)
    while probs[token] <= 0.0:  # u landed on a flat stretch's edge: step back to a token with mass
        token -= 1
    return token


def rejection_accept_tokens(
    draft: Sequence[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator
) -> tuple[int, int]:
    """Rejection sampling over one verify forward: ``(j, token)``: ``draft[:j]`` kept, then ``token``.

    Draft token ``x`` at position ``i`` is kept with probability ``min(1, p[i, x] / q[i, x])``; the
    first rejected one is replaced by a draw from the normalized residual ``max(0, p[i] - q[i])``;
    after a full accept the bonus is a draw from ``p[len(draft)]``.
    """
    for i, token in enumerate(draft):
        target, proposal = p[i, token], q[i, token]
        if proposal > 0.0 and rng.random() * proposal < target:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0.0:  # q equals p up to rounding: the residual is p itself
            residual = p[i]
        return i, draw(residual / residual.sum(), rng)
    return len(draft), draw(p[len(draft)], rng)


def match_accept_tokens(draft: Sequence[int], p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """Sample-and-match: the target samples each position itself; a draft token is kept only when
    equal to the target's sample. ``(j, token)``: ``draft[:j]`` kept, then the target's own sample."""
    for i, token in enumerate(draft):
        sampled = draw(p[i], rng)
        if sampled != token:
            return i, sampled
    return len(draft), draw(p[len(draft)], rng)
