"""Real-context acceptance and degeneracy: the figures drafters are compared on, and when a workload is a loop."""

from __future__ import annotations

import pytest

from specproof.bench import DEGENERATE_SHARE, compare, distinct_ngram_share, figures, final_period, make_baseline
from specproof.bench._real import RealContextText, greedy_continuations, measure_real_contexts, real_context_texts
from specproof.engine import InvalidSettingError, NgramDrafter, greedy_decode
from specproof.plugins import load_target

TARGET_SPEC = "reference:d_model=32,max_context=512"


# --------------------------------------------------------------------------- degeneracy


def test_distinct_share_and_period_of_loops_and_text():
    run = [32] * 100
    assert distinct_ngram_share(run) == pytest.approx(1 / 97)
    assert final_period(run) == 1
    loop = list(b"the string ") * 12
    assert distinct_ngram_share(loop) < DEGENERATE_SHARE and final_period(loop) == len(b"the string ")
    text = list(b"A passage of prose that does not repeat itself: every four-byte window differs.")
    assert distinct_ngram_share(text) > 0.9 and final_period(text) is None
    assert distinct_ngram_share([1, 2]) == 1.0 and final_period([1, 1]) is None  # too short to say
    with pytest.raises(InvalidSettingError, match="n=0 must be"):
        distinct_ngram_share(run, 0)
    with pytest.raises(InvalidSettingError, match="window=0 must be"):
        final_period(run, window=0)


def _cell(workload: str, speedup: float, *, degenerate: bool) -> dict:
    return {
        "key": f"{workload}/trained/checkpoint/k4",
        "workload": workload,
        "target": "trained",
        "rollback": "checkpoint",
        "k": 4,
        "tokens_per_round": 3.0,
        "projected_speedup": 3.0,
        "forwards_per_token": 0.33,
        "speedup": speedup,
        "cpu_speedup": speedup,
        "efficiency": speedup / 3,
        "distinct_4gram_share": 0.1 if degenerate else 0.8,
        "final_period": 1 if degenerate else None,
        "degenerate": degenerate,
    }


def test_a_degenerate_workload_is_left_out_of_the_headline_means():
    result = {
        "config": {"mode": "quick", "target": "trained"},
        "cells": [_cell("code-edit", 1.2, degenerate=False), _cell("free-text", 4.0, degenerate=True)],
    }
    figs = figures(result)
    # the loop's 4.0x would lift the mean to 2.19x; it is left out
    assert figs["mean/trained/checkpoint/k4/speedup"]["value"] == pytest.approx(1.2)
    # one workload left: gated as a cell; the pooled CPU figure keeps both (it gates cost per round)
    assert figs["mean/trained/checkpoint/k4/speedup"]["kind"] == "ratio"
    assert figs["gate/trained/k4/cpu_speedup"]["value"] == pytest.approx((1.2 * 4.0) ** 0.5)
    # its own figures are still gated per cell
    assert "free-text/trained/checkpoint/k4/speedup" in figs
    # the same workload not looping is in the mean
    result["cells"][1] = _cell("free-text", 1.2 * 4, degenerate=False)
    both = figures(result)["mean/trained/checkpoint/k4/speedup"]
    assert both["value"] == pytest.approx((1.2 * 4.8) ** 0.5) and both["kind"] == "mean_ratio"


def test_every_workload_degenerate_gives_no_mean_figure():
    result = {"config": {"mode": "quick", "target": "trained"}, "cells": [_cell("free-text", 4.0, degenerate=True)]}
    assert not [k for k in figures(result) if k.startswith("mean/")]


# --------------------------------------------------------------------------- real contexts


def _texts() -> list[RealContextText]:
    text = tuple(b"def f(x):\n    return x + 1\n\ndef g(y):\n    return f(y) * 2\n" * 3)
    return [RealContextText(source="inline", tokens=text, positions=tuple(range(12, len(text) - 6, 9)))]


def test_continuations_equal_a_fresh_greedy_decode_from_each_prefix():
    target = load_target(TARGET_SPEC)
    (text,) = _texts()
    conts = greedy_continuations(target, text, 5)
    fresh = load_target(TARGET_SPEC)
    for p, cont in zip(text.positions, conts):
        assert cont == greedy_decode(fresh, list(text.tokens[:p]), 5).tokens, p


class _OracleDrafter:
    """Correct but different: drafts the target's own greedy continuation with its own copy of the target."""

    def __init__(self) -> None:
        self.target = load_target(TARGET_SPEC)

    def propose(self, context, k):  # type: ignore[no-untyped-def]
        return list(greedy_decode(self.target, list(context), k).tokens)


class _OffByOneDrafter(_OracleDrafter):
    """Broken: the right first token, then every token wrong."""

    def propose(self, context, k):  # type: ignore[no-untyped-def]
        good = super().propose(context, k)
        return good[:1] + [(t + 1) % 256 for t in good[1:]]


def test_acceptance_by_position_judges_the_proposal_against_the_target():
    target = load_target(TARGET_SPEC)
    texts = _texts()
    n = len(texts[0].positions)
    cells = {
        c.drafter: c
        for c in measure_real_contexts(
            TARGET_SPEC,
            target,
            [("oracle", _OracleDrafter), ("off-by-one", _OffByOneDrafter), ("ngram", NgramDrafter)],
            texts,
            k=4,
        )
    }
    oracle, broken, lookup = cells["oracle"], cells["off-by-one"], cells["ngram"]
    assert oracle.positions == n and oracle.tokens_per_round == 5.0 and oracle.tokens_per_round_by_text == (5.0,)
    assert oracle.acceptance_by_position == (1.0, 1.0, 1.0, 1.0) and oracle.attempts_by_position == (n, n, n, n)
    assert broken.tokens_per_round == 2.0 and broken.acceptance_by_position == (1.0, 0.0, 0.0, 0.0)
    assert broken.attempts_by_position == (n, n, 0, 0)  # a position after a rejection is not attempted
    assert 1.0 <= lookup.tokens_per_round < 5.0 and lookup.mean_draft_length <= 4
    assert lookup.to_json()["key"] == f"{TARGET_SPEC}/ngram/k4"


def test_real_context_tokens_per_round_are_gated_counts():
    result = {
        "config": {"mode": "quick", "target": "trained"},
        "cells": [_cell("code-edit", 1.2, degenerate=False)],
        "real_contexts": {"cells": [{"key": "trained/ngram/k4", "tokens_per_round": 2.0}]},
    }
    base = make_baseline(result)
    assert base["figures"]["real/trained/ngram/k4/tokens_per_round"]["kind"] == "machine_independent"
    worse = {**result, "real_contexts": {"cells": [{"key": "trained/ngram/k4", "tokens_per_round": 1.9}]}}
    assert [f.key for f in compare(base, worse).regressions] == ["real/trained/ngram/k4/tokens_per_round"]


def test_real_context_texts_are_held_out_deterministic_and_validated(tmp_path):
    a = real_context_texts(files=2, text_tokens=512, stride=64, min_prefix=64)
    b = real_context_texts(files=2, text_tokens=512, stride=64, min_prefix=64)
    assert a == b and len(a) == 2
    assert all(t.source.startswith("test/test_") and len(t.tokens) == 512 for t in a)
    assert a[0].positions == tuple(range(64, 512, 64))
    with pytest.raises(InvalidSettingError, match="no test suite"):
        real_context_texts(files=1, text_tokens=512, stride=64, min_prefix=64, root=str(tmp_path))
    with pytest.raises(InvalidSettingError, match="min_prefix=600"):
        real_context_texts(files=1, text_tokens=512, stride=64, min_prefix=600)
    with pytest.raises(InvalidSettingError, match="stride=0 must be"):
        real_context_texts(files=1, text_tokens=512, stride=0, min_prefix=64)


def test_a_python_without_its_test_suite_skips_real_contexts_with_the_reason(tmp_path, monkeypatch):
    from specproof.bench import BenchConfig, _real, run_bench
    from specproof.bench.cli_support import real_context_lines

    monkeypatch.setattr(_real, "_stdlib_root", lambda: str(tmp_path))
    config = BenchConfig(
        mode="quick",
        companions=(),
        workloads=("free-text",),
        rollbacks=("checkpoint",),
        prompt_chars=200,
        chunk_tokens=4,
        chunks=2,
        verify_reps=1,
        drafter_contexts=(64, 128),
        drafter_reps=2,
        drafters=("ngram",),
        optional_drafters=False,
        real_files=1,
        peers=False,
        batch_sizes=(),
    )
    data = run_bench(config).to_json()
    assert data["real_contexts"]["status"] == "skip" and "no test suite" in data["real_contexts"]["reason"]
    assert real_context_lines(data) == [f"real contexts: not measured ({data['real_contexts']['reason']})"]
    assert len(data["drafter_cells"]) == 1  # the rest was measured
