"""``bundle.states`` around router near-ties, on two tiny stand-in models (no Core ML needed).

A chunk that ends after a row the source routed by a hair is not compared (fp16 may route that row
otherwise), so the states are compared once more after the last confidently routed row (the rows fed
again, the chunking cut there). Without that, a drawn run whose first chunk holds a near-tie compares
no state: a source whose routing is near a tie at most positions (the sigmoid router of lfm2-moe) left
``bundle.states`` with nothing exercised. A bundle whose states alone are wrong (its logits right)
must still fail there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from specproof.coreml import CheckOptions, _check, check_bundle

VOCAB, CONTEXT, QUERY = 256, 64, 5
NEAR_TIE = 2  # the source's router margin is small at this position only


class _Stand:
    """Logits from the running token sum; a ``conv_state`` holding that sum. ``source``: reports router margins
    (small at ``NEAR_TIE``); ``state_bug``: the state is off by 10 from the second token on, the logits not."""

    vocab_size, max_context, max_query = VOCAB, CONTEXT, QUERY

    def __init__(self, *, source: bool, state_bug: bool = False) -> None:
        self.source, self.state_bug = source, state_bug
        self.reset()

    def reset(self) -> None:
        self.processed, self.total = 0, 0
        self.last_router_margins: tuple[np.ndarray, ...] = ()

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        rows = np.zeros((len(tokens), VOCAB), np.float32)
        for i, tok in enumerate(tokens):
            self.total += int(tok)
            rows[i, self.total % VOCAB] = 4.0
        positions = np.arange(self.processed, self.processed + len(tokens))
        if self.source:
            self.last_router_margins = (np.where(positions == NEAR_TIE, 0.01, 2.0).astype(np.float32),)
        self.processed += len(tokens)
        return rows

    def state_arrays(self) -> dict[str, np.ndarray]:
        off = 10.0 if self.state_bug and self.processed >= 2 else 0.0
        return {"conv_state": np.array([self.total + off], np.float64)}


def _tally(bundle: _Stand, tokens: list[int], chunks: list[int]) -> tuple[Any, Any]:
    tally = _check._Tally()
    found = _check._compare_run(bundle, _Stand(source=True), tokens, chunks, CheckOptions(), tally)
    return tally, found


def test_the_states_before_a_near_tie_in_the_first_chunk_are_compared() -> None:
    tally, found = _tally(_Stand(source=False), [3, 1, 4, 1, 5], [5])
    assert found is None
    assert tally.rows == NEAR_TIE and tally.excused_rows == 5 - NEAR_TIE  # rows 0 and 1; the rest excused
    assert tally.chunks_with_states == 1 and tally.states == {"conv_state"}  # after the two confident rows


def test_a_run_that_starts_on_a_near_tie_compares_nothing() -> None:
    tally = _check._Tally()
    source = _Stand(source=True)
    source.reset()
    opts = CheckOptions(router_margin=3.0)  # every position is a near-tie at this margin
    assert _check._compare_run(_Stand(source=False), source, [3, 1, 4], [3], opts, tally) is None
    assert tally.rows == 0 and tally.chunks_with_states == 0


def test_a_state_only_bug_fails_on_bundle_states() -> None:
    _, found = _tally(_Stand(source=False, state_bug=True), [3, 1, 4, 1, 5], [5])
    assert found is not None and found.rule == "bundle.states"
    assert "'conv_state' after 2 tokens" in str(found) and "fed again up to the router near-tie" in str(found)


@pytest.mark.parametrize("state_bug", [False, True])
def test_check_bundle_exercises_the_states(monkeypatch: pytest.MonkeyPatch, state_bug: bool) -> None:
    monkeypatch.setattr(_check, "_load_bundle", lambda path: _Stand(source=False, state_bug=state_bug))
    report = check_bundle("stand-in.mlpackage", _Stand(source=True), options=CheckOptions(examples=30))
    results = {r.id: r for r in report.results}
    assert results["bundle.logits"].status == "pass" and results["bundle.logits"].exercised > 0
    if state_bug:
        assert results["bundle.states"].status == "fail", results["bundle.states"]
    else:
        assert results["bundle.states"].status == "pass" and results["bundle.states"].exercised > 0
