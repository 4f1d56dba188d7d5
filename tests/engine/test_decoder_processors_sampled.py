"""Sampled decoding with DecodeParams is lossless in distribution: the first two tokens of one speculative round
(a one-token draft, then the target's own token) follow plain sampling from the processed ``p``, where the
second position's processors count the first token (docs/contract.md, "Decode state").

A chi-square test against the exact joint distribution (every first token enumerated on the model). The seeds
are fixed, so the test is deterministic; a correct decoder fails it with probability below ``ALPHA`` over the
choice of seeds (cells with fewer than 5 expected draws pooled into one). It rejects a decoder that skips the
penalties on draft rows. This is a unit test of the reference decoder, not the suite's sampled check, which does
not draw decode parameters yet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from scipy import stats

from _targets import small_target
from specproof.conformance.zoo._decode_engines import PenaltiesIgnoredWhenDrafting
from specproof.contract import DecodeParams, SamplingParams, processed_distribution
from specproof.contract.decode_state import OracleProcessors
from specproof.engine import RequestProcessors, SpecDecoder

pytestmark = pytest.mark.slow  # a few thousand generations

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
PARAMS = DecodeParams(repetition_penalty=3.0, frequency_penalty=2.0, presence_penalty=1.0, logit_bias={7: 1.5})
SAMPLING = SamplingParams(temperature=1.5, top_k=12)
GENERATIONS = 3000
ALPHA = 1e-6


class _Fixed:
    """Always drafts one token: the processed argmax after the prompt, so it is often accepted."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return [self.token][:k]


def _exact_joint() -> dict[tuple[int, int], float]:
    first = OracleProcessors(PARAMS, PROMPT)
    p0 = processed_distribution(first.apply(_row(PROMPT)), SAMPLING)
    joint: dict[tuple[int, int], float] = {}
    for t0 in np.flatnonzero(p0):
        proc = OracleProcessors(PARAMS, PROMPT)
        proc.feed(int(t0))
        p1 = processed_distribution(proc.apply(_row([*PROMPT, int(t0)])), SAMPLING)
        for t1 in np.flatnonzero(p1):
            joint[(int(t0), int(t1))] = float(p0[t0] * p1[t1])
    return joint


def _row(context: list[int]) -> np.ndarray:
    """The target's logits for the position after ``context`` (a fresh model, plain forward)."""
    target = small_target()
    return np.asarray(target.forward(context), dtype=np.float64)[-1]


def _sample(processors: type[RequestProcessors]) -> Counter[tuple[int, int]]:
    draft = int(np.argmax(OracleProcessors(PARAMS, PROMPT).apply(_row(PROMPT))))
    decoder = SpecDecoder(small_target(), _Fixed(draft), k=1, rollback="checkpoint")
    decoder.processors_class = processors
    counts: Counter[tuple[int, int]] = Counter()
    for seed in range(GENERATIONS):
        gen = decoder.generate(PROMPT, 2, decode=PARAMS, sampling=SAMPLING.with_seed(seed))
        counts[(gen.tokens[0], gen.tokens[1])] += 1
    return counts


def _p_value(counts: Counter[tuple[int, int]], joint: dict[tuple[int, int], float]) -> float:
    if set(counts) - set(joint):
        return 0.0  # a pair of probability 0 was emitted
    big = [cell for cell, p in joint.items() if p * GENERATIONS >= 5]
    observed = [counts[c] for c in big] + [GENERATIONS - sum(counts[c] for c in big)]
    expected = [joint[c] * GENERATIONS for c in big] + [GENERATIONS * (1 - sum(joint[c] for c in big))]
    return float(stats.chisquare(observed, expected).pvalue)


def test_sampled_rounds_with_processors_follow_the_processed_p() -> None:
    joint = _exact_joint()
    assert abs(sum(joint.values()) - 1.0) < 1e-9
    assert _p_value(_sample(RequestProcessors), joint) > ALPHA


def test_a_decoder_that_skips_penalties_on_draft_rows_is_rejected() -> None:
    assert _p_value(_sample(PenaltiesIgnoredWhenDrafting.processors_class), _exact_joint()) < ALPHA
