"""Hypothesis strategies for decode-time state (docs/contract.md, "Decode state").

``processor_configs`` draws a request's logits processors (penalties, logit bias, bad words);
``stop_sets`` places EOS ids, ``min_tokens`` and stop sequences on a known continuation, so that a
stop ends at every offset of a draft block (inside an accepted block, straddling two rounds, on the
same token as an EOS) instead of never occurring; ``draft_schedules`` says, per round, how long a
draft is and how many of its leading tokens are right.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from hypothesis import strategies as st

from specproof.contract import DecodeParams

__all__ = ["DECODE_KINDS", "PROCESSOR_KINDS", "draft_schedules", "processor_configs", "stop_sets"]

DECODE_KINDS: tuple[str, ...] = ("penalties", "min_tokens", "stops")
"""What a decode-state search varies: the processors, ``min_tokens`` against EOS, or the stops."""

PROCESSOR_KINDS: frozenset[str] = frozenset({"penalties", "logit_bias", "bad_words"})
"""The features ``processor_configs`` draws (the processors a search may put on a request)."""


@st.composite
def processor_configs(
    draw: st.DrawFn, vocab_size: int, *, features: frozenset[str], active: bool = False
) -> DecodeParams:
    """Penalties, a logit bias and bad words, each only where ``features`` holds its name; strong enough
    to change a small model's greedy output (the penalties are what make it stop repeating itself).
    ``active``: every declared processor on (what shrinks is how strong, never to off)."""
    token = st.integers(0, vocab_size - 1)
    values: dict[str, object] = {}
    if "penalties" in features:
        off = [] if active else [1.0]
        values["repetition_penalty"] = draw(st.sampled_from([*off, 2.0, 1.3, 4.0]), label="repetition_penalty")
        values["presence_penalty"] = draw(st.sampled_from([0.0, 0.5, 2.0]), label="presence_penalty")
        values["frequency_penalty"] = draw(st.sampled_from([*[0.0][: len(off)], 1.5, 0.4]), label="frequency_penalty")
    if "logit_bias" in features:
        biases = st.sampled_from([8.0, -100.0, -4.0, 3.0])
        values["logit_bias"] = draw(
            st.dictionaries(token, biases, min_size=int(active), max_size=4), label="logit_bias"
        )
    if "bad_words" in features:
        words = st.lists(st.lists(token, min_size=1, max_size=2), max_size=2)
        values["bad_words"] = draw(words, label="bad_words")
    return DecodeParams(**values)  # type: ignore[arg-type]


@st.composite
def stop_sets(
    draw: st.DrawFn, base: DecodeParams, continuation: Sequence[int], *, kind: str
) -> tuple[DecodeParams, int | None]:
    """``base`` with stops placed on ``continuation`` (plain decoding's output under ``base``), and the
    ``eos_token_id`` of the call. ``min_tokens``: an EOS id taken from the continuation and a
    ``min_tokens`` around its first place; ``stops``: EOS ids and 1-3 stop sequences ending at drawn
    offsets (a later one may overlap an earlier one, or end on an EOS)."""
    n = len(continuation)
    if n == 0:
        return base, None
    place = st.integers(0, n - 1)
    if kind == "min_tokens":
        at = draw(place, label="EOS at output position")
        first = list(continuation).index(continuation[at])
        least = draw(st.integers(max(0, first - 1), first + 3), label="min_tokens")
        return attrs.evolve(base, min_tokens=least, eos_token_ids=[continuation[at]]), None
    stops = []
    for _ in range(draw(st.integers(1, 3), label="stop sequences")):
        end = draw(place, label="stop ends at output position")
        length = draw(st.integers(1, min(3, end + 1)), label="stop length")
        stops.append(continuation[end + 1 - length : end + 1])
    eos_ids = draw(st.lists(st.sampled_from(list(continuation)), max_size=2), label="EOS ids")
    eos = draw(st.one_of(st.none(), st.sampled_from(list(continuation))), label="eos_token_id")
    return attrs.evolve(base, stop=stops, eos_token_ids=eos_ids), eos


def draft_schedules(*, k: int, rounds: int = 24) -> st.SearchStrategy[list[tuple[int, int]]]:
    """Per round, (draft length, right leading tokens): full blocks, rejections at 0, partial accepts and
    empty drafts, in a drawn order (the decoder cuts a length to its room)."""
    round_ = st.integers(0, k).flatmap(
        lambda length: st.tuples(st.just(length), st.one_of(st.just(length), st.integers(0, length)))
    )
    return st.lists(round_, min_size=1, max_size=rounds)
