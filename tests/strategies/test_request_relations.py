"""The coverage model of requests: each relation classified, tracked across reset() and k, and the words
a shrunk history and a feature breach use from it."""

from __future__ import annotations

import pytest

from specproof.strategies import REQUEST_COVERAGE, RelationTracker, relation_of, unreached_relations
from specproof.strategies._request_relations import DESCRIPTIONS, RELATIONS, SESSION_KIND
from specproof.strategies._session_features import _position_in_request
from specproof.strategies._session_history import REQUEST_KINDS, SessionRequest
from specproof.strategies._session_runner import _renote

BEFORE = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # a prompt of 6 tokens, then 4 generated


@pytest.mark.parametrize(
    ("after", "relation"),
    [
        ([1, 2, 3, 4, 5, 6], "same"),
        ([1, 2, 3, 4, 5, 6, 7, 8], "extension"),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], "continuation"),  # a user turn
        ([1, 2, 3, 4, 5, 6, 7, 20], "continuation"),  # a bonus token after one accepted
        ([1, 2, 3, 4, 5, 6, 20], "continuation"),
        ([1, 2, 20, 21], "edit_early"),
        ([1, 2, 3, 4, 20], "edit_late"),
        ([1, 2, 3], "shorter"),
        ([30, 31, 32, 4, 5, 6, 7, 40], "shared_block"),
        ([1, 31, 32, 33, 5, 6, 7, 8], "shared_block"),  # an edit whose later block is unchanged
        ([30, 31, 32], "unrelated"),
    ],
)
def test_each_relation_is_classified(after: list[int], relation: str) -> None:
    assert relation_of(BEFORE, after, given=6) == relation


def test_the_first_call_is_fresh_and_every_relation_has_words_and_a_session_kind() -> None:
    assert relation_of(None, [1, 2], given=0) == "fresh"
    assert set(DESCRIPTIONS) == set(REQUEST_COVERAGE)
    assert set(SESSION_KIND) == set(RELATIONS) and set(SESSION_KIND.values()) <= set(REQUEST_KINDS)


def test_the_tracker_tags_reset_and_k_at_one_length() -> None:
    tracker = RelationTracker()
    assert tracker.call([1, 2, 3], [4, 5], k=2) == ["fresh"]
    assert tracker.call([1, 2, 3], [4], k=3) == ["same", "k_larger"]
    assert tracker.call([1, 2, 3], [4], k=1) == ["same", "k_smaller"]
    tracker.reset()
    assert tracker.call([1, 2, 3], [], k=1) == ["same", "after_reset", "same_after_reset", "k_equal"]
    tracker.reset()
    assert tracker.call([1, 2, 3, 9], [], k=1) == ["continuation", "after_reset", "continuation_after_reset"]
    assert tracker.call([9], [], k=None) == ["unrelated"]
    counts = tracker.counts
    assert unreached_relations(counts, ["same", "shorter", "k_larger"]) == ["shorter"]


def test_a_shrunk_history_is_relabelled_from_its_relations() -> None:
    """A user turn whose earlier request was dropped is an edit of what now precedes it: its label says so."""
    requests = [
        SessionRequest(kind="new_prompt", prompt=(1, 2, 3, 4, 5, 6), max_new_tokens=2, note="a new prompt"),
        SessionRequest(kind="multi_turn", prompt=(1, 2, 3, 4, 20, 21), max_new_tokens=2, note="context 3 of 5 + turn"),
        SessionRequest(kind="reset"),
        SessionRequest(kind="edit", prompt=(1, 2, 3, 4, 20, 21), max_new_tokens=2, note="cut at 4"),
    ]
    out = _renote(requests, lambda prompt, n: [7] * n)
    assert [r.kind for r in out] == ["new_prompt", "edit", "reset", "regenerate"]
    assert [r.note for r in out] == [
        "the first request of an instance",
        "an edit of the previous prompt in its second half (shares its first 4 tokens with the previous context: "
        "6 prompt + 2 output tokens)",
        "the engine forgets its caches",
        "the previous prompt again (a regenerate), after reset()",
    ]


def test_a_feature_position_is_placed_truthfully_in_its_request() -> None:
    """The prompt's last position is the prompt's (its pending token), not one the request generated."""
    assert _position_in_request(36, 37) == (
        "position 36 is the prompt's last token (the prompt has 37 tokens, positions 0-36): the pending token, "
        "which this request's first verify forward processed"
    )
    assert _position_in_request(35, 37) == "position 35 is in the prompt (37 tokens, positions 0-36)"
    assert _position_in_request(37, 37) == (
        "position 37 holds the 1st token this request generated (the prompt has 37 tokens, positions 0-36)"
    )
    assert _position_in_request(48, 37).startswith("position 48 holds the 12th token this request generated")
