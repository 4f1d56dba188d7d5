"""NgramDrafter: the incremental index equals a naive rescan, and contract details."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specproof.engine import InvalidSettingError, NgramDrafter
from specproof.engine.drafters import naive_ngram_propose

small_tokens = st.lists(st.integers(0, 4), min_size=1, max_size=60)


@given(
    tokens=small_tokens,
    k=st.integers(0, 8),
    ns=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    prefer=st.sampled_from(["recent", "earliest"]),
    extend=st.booleans(),
    cuts=st.lists(st.integers(1, 60), max_size=5),
)
def test_incremental_matches_naive_scan(tokens, k, ns, prefer, extend, cuts):
    min_n, extra = ns
    max_n = min_n + extra
    drafter = NgramDrafter(min_n=min_n, max_n=max_n, prefer=prefer, extend=extend)
    # feed growing prefixes, as the decoder does, comparing at every stop
    for cut in sorted({min(c, len(tokens)) for c in cuts} | {len(tokens)}):
        ctx = tokens[:cut]
        expected = naive_ngram_propose(ctx, k, min_n=min_n, max_n=max_n, prefer=prefer, extend=extend)
        assert drafter.propose(ctx, k) == expected, (ctx, k)


@given(a=small_tokens, b=small_tokens, k=st.integers(1, 6))
def test_unrelated_context_rebuilds_index(a, b, k):
    drafter = NgramDrafter()
    drafter.propose(a, k)
    assert drafter.propose(b, k) == naive_ngram_propose(b, k)


def test_proposes_the_continuation_of_the_most_recent_occurrence():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
    assert NgramDrafter().propose(ctx, 3) == [7, 1, 2]
    assert NgramDrafter(prefer="earliest").propose(ctx, 3) == [9, 1, 2]


def test_k_zero_and_no_match_give_empty_drafts():
    assert NgramDrafter().propose([1, 2, 3], 0) == []
    assert NgramDrafter().propose([1, 2, 3], 4) == []


def test_does_not_mutate_context():
    ctx = [5, 6, 5, 6, 5]
    NgramDrafter().propose(ctx, 4)
    assert ctx == [5, 6, 5, 6, 5]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(min_n=0), "min_n=0 must be an integer >= 1"),
        (dict(min_n=3, max_n=2), "min_n=3 must not exceed max_n=2"),
        (dict(prefer="latest"), "prefer='latest'"),
        (dict(extend=1), "extend must be True or False"),
    ],
)
def test_settings_are_validated(kwargs, message):
    with pytest.raises(InvalidSettingError, match=message):
        NgramDrafter(**kwargs)


def test_runs_and_loops_are_extended_by_their_period():
    """A match whose continuation reaches the end of the context repeats it (the issue's cases)."""
    assert NgramDrafter().propose([5, 9, 2] + [7] * 12, 4) == [7, 7, 7, 7]
    assert NgramDrafter().propose([1, 2, 3] * 5, 4) == [1, 2, 3, 1]
    assert NgramDrafter().propose([1, 2, 3] * 5, 8) == [1, 2, 3, 1, 2, 3, 1, 2]
    # a match far enough back is not extended: only its own continuation
    assert NgramDrafter().propose([1, 2, 3, 4, 5, 6, 1, 2, 3], 4) == [4, 5, 6, 1]
    # extend=False keeps the draft cut at the end of the context
    assert NgramDrafter(extend=False).propose([5, 9, 2] + [7] * 12, 4) == [7]
    assert NgramDrafter(extend=False).propose([1, 2, 3] * 5, 4) == [1, 2, 3]


@given(
    body=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    reps=st.integers(2, 5),
    tail=st.integers(0, 5),
    k=st.integers(1, 12),
    prefix=st.lists(st.integers(7, 9), max_size=4),
)
def test_a_periodic_context_is_continued_for_k_tokens(body, reps, tail, k, prefix):
    """On text ending in a loop of period p <= max_n, the draft is the loop's next k tokens."""
    period = len(body)
    looped = body * (reps + 1)
    ctx = prefix + looped[: period * reps + tail % period]
    drafter = NgramDrafter(min_n=1, max_n=max(3, period))
    expected = [looped[(period * reps + tail % period + i) % period] for i in range(k)]
    assert drafter.propose(ctx, k) == expected, (ctx, k)


@given(tokens=small_tokens, k=st.integers(1, 10))
def test_a_match_always_gives_k_tokens(tokens, k):
    """Whenever any n-gram matches, the draft has exactly k tokens (never cut at the context end)."""
    drafter = NgramDrafter()
    draft = drafter.propose(tokens, k)
    has_match = any(tokens[s] == tokens[-1] for s in range(len(tokens) - 1))
    assert len(draft) == (k if has_match else 0)
