"""Certification judges feature drafters across requests, and names why a feature row is wrong.

- ``engine.session`` (the session machine) installs feature drafters on an engine whose own
  drafter reads features and judges every proposal: the zoo's prefix cache that hands zero
  rows is rejected at quick, naming the cause; its correct control passes, with a note of how
  many proposals and prefix hits were judged.
- ``engine.features`` (the engine-case search) compares the engine's target with the oracle
  before the features: an engine whose target state is wrong is told so, not that it handed
  the wrong rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from specproof.conformance import certify
from specproof.conformance.zoo._feature_drafters import FeatureZooEngine

pytestmark = pytest.mark.slow  # a few seconds each: outside `tox -e quick`, always in `tox`

ZOO = "specproof.conformance.zoo"


def _result(spec: str, only: str, tmp_path: Any) -> dict[str, Any]:
    report = certify("engine", engine=spec, profile="quick", only=(only,), db=str(tmp_path / "db")).to_json()
    [result] = [r for r in report["results"] if r["invariant"] == only]
    return result  # type: ignore[no-any-return]


def test_engine_session_rejects_the_zero_row_prefix_cache_naming_the_cause(tmp_path: Any) -> None:
    result = _result(f"{ZOO}:prefix_hit_zero_features", "engine.session", tmp_path)
    assert result["status"] == "fail", result
    detail = result["detail"]
    assert "the features the engine handed its feature drafter (layers [1, 3]) are wrong" in detail
    assert "all zeros" in detail and "served from its caches" in detail and "features[1] row" in detail


def test_engine_session_passes_the_correct_prefix_cache_and_says_what_it_judged(tmp_path: Any) -> None:
    result = _result(f"{ZOO}:feature_session_engine", "engine.session", tmp_path)
    assert result["status"] == "pass", result
    [note] = [n for n in result["notes"] if n.startswith("features judged at ")]
    proposals, requests, hits = (int(w) for w in note.replace("(s)", "").split() if w.isdigit())
    assert proposals >= requests > 0 and hits > 0, note


def test_a_session_engine_with_a_plain_drafter_judges_no_features(tmp_path: Any) -> None:
    result = _result(f"{ZOO}:session_engine", "engine.session", tmp_path)
    assert result["status"] == "pass" and not any(n.startswith("features judged") for n in result["notes"])


class FeedsAWrongPrompt(FeatureZooEngine):
    """The target state is wrong (the prefill feeds the prompt's first token changed); the handoff is right."""

    bug = "the prefill feeds a wrong first token: the target state, and so its features, are wrong"

    def _features(
        self, target: Any, tokens: Sequence[int], layers: tuple[int, ...], checkpoints: bool
    ) -> tuple[np.ndarray, dict[int, np.ndarray], list[object] | None]:
        fed = list(tokens)
        if target.processed == 0 and len(fed) > 1:
            fed[0] = (fed[0] + 1) % target.vocab_size
        return super()._features(target, fed, layers, checkpoints)


def feeds_a_wrong_prompt() -> FeedsAWrongPrompt:
    return FeedsAWrongPrompt()


def test_engine_features_names_a_wrong_target_state_not_the_features(tmp_path: Any) -> None:
    result = _result(f"{__name__}:feeds_a_wrong_prompt", "engine.features", tmp_path)
    assert result["status"] == "fail", result
    assert "the engine's target state itself is wrong here" in result["detail"], result["detail"]
    assert "not the feature handoff" in result["detail"]


def test_engine_features_still_blames_the_handoff_when_the_target_is_right(tmp_path: Any) -> None:
    result = _result(f"{ZOO}:feature_from_rejected", "engine.features", tmp_path)
    assert result["status"] == "fail", result
    assert "target state" not in result["detail"]
    assert "it is the feature of draft token" in result["detail"], result["detail"]


def test_a_stale_row_from_a_request_no_judge_watched_is_named_stale() -> None:
    """The first request installs no feature drafter, so no judge sees it; its rows handed again on an edit
    are still recognised as stale rows from another request (not "matches nothing")."""
    from specproof.conformance.zoo import small_reference
    from specproof.conformance.zoo._feature_sessions import FeatureSessionEngine, PrefixHitStaleFeatures
    from specproof.strategies import SessionHistory, SessionRequest, replay_session, target_greedy

    first = tuple((7 * i + 3) % 64 for i in range(20))
    edited = first[:6] + tuple((5 * i + 1) % 64 for i in range(10))
    history = SessionHistory(
        requests=(
            SessionRequest(kind="new_prompt", prompt=first, max_new_tokens=6, drafter="engine"),
            SessionRequest(kind="edit", prompt=edited, max_new_tokens=6, drafter="engine", feature_layers=(1, 3)),
        )
    )
    judge = {"greedy": target_greedy(small_reference()), "vocab_size": 64, "reference_factory": small_reference}
    assert replay_session(history, engine_factory=FeatureSessionEngine, **judge) == []
    [failure] = replay_session(history, engine_factory=PrefixHitStaleFeatures, **judge)
    assert failure.explanation.endswith(
        "features[1] row 6 (position 6 of the 15 accepted, token 1) is not the target's feature at that position: "
        "it is position 6's feature in an earlier context (25 tokens, which differs from this one from position 6 "
        "on): stale rows from another request; position 6 is in the prompt (16 tokens, positions 0-15)"
    ), failure.explanation
