"""The speed gate: it passes an unchanged run and catches planted regressions.

Gate logic is checked on synthetic result records (exact, instant); then real bench runs
(the four workloads, checkpoint rollback, --quick-sized chunks) prove the end-to-end path
with the injectors of ``specproof.bench._inject``: an unchanged rerun passes, an extra
target forward per round fails on the counts, and a round made half again as slow (in the
proposal or in the verify) fails on the pooled CPU-time ratio when CPU-time ratios are gated
(``gate_cpu``: by default they are reported); a real record edited to a 15 % slower round fails on
it too (deterministically). The measured 15 % sensitivity is a
benchmark's: docs/bench.md has the table from ``benchmarks/gate_sensitivity.py``.
"""

from __future__ import annotations

import copy
import json

import pytest

from _bench_records import cell as _cell
from _bench_records import result as _result
from _bench_records import tiny_config as _tiny_config
from specproof.bench import (
    BASELINE_SCHEMA,
    MEAN_RATIO_TOLERANCE,
    OPTIONAL_DRAFTERS,
    RATIO_TOLERANCE,
    BaselineError,
    BenchConfig,
    compare,
    figures,
    load_baseline,
    make_baseline,
    run_bench,
    save_baseline,
)
from specproof.bench._inject import extra_forward, round_cpu_seconds, slow_proposal, slow_verify
from specproof.cli import main
from specproof.engine import InvalidSettingError, NgramDrafter

# --------------------------------------------------------------------------- synthetic records


def test_unchanged_result_passes_and_every_figure_is_checked():
    base = make_baseline(_result())
    report = compare(base, _result())
    assert report.passed
    assert len(report.findings) == 2 * 5 + 2 * 2 + 1  # per cell, per (target, rollback, k) mean, drafter
    # one workload per mean: gated as a cell ("ratio"); two make a "mean_ratio"
    assert {f.kind for f in report.findings} == {"machine_independent", "ratio"}
    two = _result([_cell(w, "checkpoint") for w in ("code-edit", "structured")])
    assert figures(two)["mean/reference/checkpoint/k4/speedup"]["kind"] == "mean_ratio"


def test_extra_forward_per_round_fails_on_forwards_per_token_rise():
    base = make_baseline(_result())
    worse = _result([_cell("code-edit", "checkpoint", forwards_per_token=0.8), _cell("code-edit", "replay")])
    report = compare(base, worse)
    assert not report.passed
    (bad,) = report.regressions
    assert bad.key == "code-edit/reference/checkpoint/k4/forwards_per_token"
    assert bad.baseline == 0.4 and bad.now == 0.8 and bad.change == pytest.approx(1.0)


def test_machine_independent_tolerance_is_tight_and_one_sided():
    base = make_baseline(_result())
    tpr = 2.5
    slightly = _result([_cell("code-edit", "checkpoint", tokens_per_round=tpr * 0.98), _cell("code-edit", "replay")])
    assert [f.key.rsplit("/", 1)[1] for f in compare(base, slightly).regressions] == ["tokens_per_round"]
    better = _result([_cell("code-edit", "checkpoint", tokens_per_round=3.0, forwards_per_token=0.3)])
    better["cells"].append(_cell("code-edit", "replay"))
    assert compare(base, better).passed  # improvements never fail


def test_ratio_drop_beyond_noise_threshold_fails_within_it_passes():
    base = make_baseline(_result())
    inside = 1.8 * (1 - MEAN_RATIO_TOLERANCE / 2)
    assert compare(
        base,
        _result([_cell("code-edit", "checkpoint", speedup=inside), _cell("code-edit", "replay")]),
        gate_wall=True,
    ).passed
    outside = 0.72 * (1 - RATIO_TOLERANCE) * 0.9
    report = compare(
        base,
        _result([_cell("code-edit", "checkpoint", efficiency=outside), _cell("code-edit", "replay")]),
        gate_wall=True,
    )
    assert [f.key for f in report.regressions] == [
        "code-edit/reference/checkpoint/k4/efficiency",
        "mean/reference/checkpoint/k4/efficiency",
    ]
    # the drafter's 64K/1K cost is a lower-is-better ratio
    assert not compare(base, _result(scaling=1.0 + RATIO_TOLERANCE * 2), gate_wall=True).passed


def test_small_slowdown_of_every_workload_is_caught_by_the_mean():
    names = ("code-edit", "retrieval-qa", "structured", "free-text")
    base = make_baseline(_result([_cell(w, "checkpoint") for w in names]))
    drop = 1 - (MEAN_RATIO_TOLERANCE + RATIO_TOLERANCE) / 2  # inside the per-cell threshold, beyond the mean's
    slower = _result([_cell(w, "checkpoint", speedup=1.8 * drop) for w in names])
    assert [f.key for f in compare(base, slower, gate_wall=True).regressions] == [
        "mean/reference/checkpoint/k4/speedup"
    ]


def test_missing_figure_fails_and_new_figure_is_listed():
    base = make_baseline(_result())
    fewer = _result([_cell("code-edit", "checkpoint")])
    report = compare(base, fewer)
    assert {f.status for f in report.regressions} == {"missing"}
    more = _result([*_result()["cells"], _cell("structured", "checkpoint")])
    report = compare(base, more)
    assert report.passed and any(k.startswith("structured/") for k in report.new_figures)


def test_baseline_of_another_mode_is_a_usage_error():
    base = make_baseline(_result(mode="full"))
    with pytest.raises(BaselineError, match="'mode'"):
        compare(base, _result(mode="quick"))


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.pop("figures"), "'figures'"),
        (lambda d: d.update(schema="nope"), "'schema'"),
        (lambda d: d["thresholds"].pop("ratio"), "'thresholds.ratio'"),
        (lambda d: next(iter(d["figures"].values())).pop("value"), ".value'"),
        (lambda d: d["thresholds"].update(ratio=2), "thresholds.ratio"),
        (lambda d: next(iter(d["figures"].values())).update(value="fast"), ".value"),
        (lambda d: next(iter(d["figures"].values())).update(kind="seconds"), ".kind"),
        (lambda d: next(iter(d["figures"].values())).update(better="up"), ".better"),
    ],
)
def test_bad_baseline_file_names_the_field(tmp_path, edit, field):
    doc = make_baseline(_result())
    edit(doc)
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert field in str(info.value) and str(path) in str(info.value)


def test_not_json_and_unreadable_baseline(tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text("{not json")
    with pytest.raises(BaselineError, match="not JSON"):
        load_baseline(bad)
    with pytest.raises(BaselineError, match="cannot read"):
        load_baseline(tmp_path / "absent.json")


def test_saved_baseline_round_trips_with_thresholds_platform_version(tmp_path):
    path = tmp_path / "baseline.json"
    save_baseline(path, _result())
    doc = load_baseline(path)
    assert doc["schema"] == BASELINE_SCHEMA
    assert doc["version"] == "0.1.0" and doc["platform"]["cpus"] == "2"
    assert set(doc["thresholds"]) == {"machine_independent", "ratio", "mean_ratio", "cpu_ratio", "cpu_pooled"}
    assert doc["figures"] == figures(_result())


# --------------------------------------------------------------------------- the command's exit codes


def test_cli_bad_baseline_is_exit_2_before_measuring(tmp_path, capsys, monkeypatch):
    import specproof.bench as bench

    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("measured despite a bad baseline"))
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"schema": BASELINE_SCHEMA}))
    assert main(["bench", "--quick", "--gate", str(path)]) == 2
    assert "missing field 'mode'" in capsys.readouterr().err


def test_cli_gate_exit_codes(tmp_path, capsys, monkeypatch):
    import specproof.bench as bench

    real = run_bench(_tiny_config(chunks=4))
    baseline = tmp_path / "baseline.json"
    save_baseline(baseline, real.to_json())

    class Fake:
        def __init__(self, data):
            self.data = data

        def to_json(self):
            return copy.deepcopy(self.data)

    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: Fake(real.to_json()))
    monkeypatch.setattr(bench, "BenchConfig", _FakeConfig)
    assert main(["bench", "--quick", "--gate", str(baseline), "--json", str(tmp_path / "r.json")]) == 0
    assert "gate passed" in capsys.readouterr().out
    worse = real.to_json()
    worse["cells"][0]["forwards_per_token"] *= 2
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: Fake(worse))
    assert main(["bench", "--quick", "--gate", str(baseline)]) == 1
    out = capsys.readouterr().out
    assert "gate failed" in out and "forwards_per_token" in out


class _FakeConfig:
    """BenchConfig.quick() replaced by the tiny config, so the CLI test does not measure for a minute."""

    @staticmethod
    def quick(*, target: str) -> BenchConfig:
        return _tiny_config(chunks=4)

    full = quick


# --------------------------------------------------------------------------- real runs, planted regressions


@pytest.fixture(scope="module")
def baseline_run():
    # a warm-up first: a cold first bench (imports, caches, CPU frequency) inflated one cell's speedup
    # to 3.4 where warm runs give ~1.3-2, so the result depended on which tests ran before this module
    run_bench(_tiny_config(chunks=4))
    result = run_bench(_tiny_config())
    return result, make_baseline(result.to_json())


def test_real_unchanged_run_passes(baseline_run):
    """An unchanged rerun passes the default gate: its counts are exact, whatever the machine's load.

    Its timed ratios (wall clock and CPU time) are compared and reported, not gated by default, and not
    asserted here: over this config's 12 chunks one descheduled stretch moves a cell's wall speedup by
    half (measured: 2 of 3 reruns at load 5 dropped one cell's from 3.1 to 1.2), and CPU-bound jobs
    beside the run move the CPU-time ratios (issue 35)."""
    first, base = baseline_run
    assert all(c.lossless and c.forwards_per_round == 1.0 for c in first.cells)  # checkpoint: one per round
    assert "gate/trained/k4/cpu_speedup" in base["figures"]
    report = compare(base, run_bench(_tiny_config()).to_json())
    assert {f.kind for f in report.findings} >= {"ratio", "machine_independent", "cpu_ratio", "cpu_pooled"}
    assert report.passed, [(f.key, f.baseline, f.now) for f in report.regressions]
    assert {f.status for f in report.findings if f.kind != "machine_independent"} == {"reported"}


def test_real_extra_forward_per_round_is_caught(baseline_run):
    _, base = baseline_run
    result = run_bench(_tiny_config(), decoder_factory=extra_forward)
    bad = {f.key.rsplit("/", 1)[1] for f in compare(base, result.to_json()).regressions}
    assert {"forwards_per_token", "projected_speedup"} <= bad
    assert all(c.forwards_per_round == pytest.approx(2.0) for c in result.cells)


def test_real_record_with_a_15_percent_slower_round_fails_on_the_pooled_cpu_figure_when_gated(baseline_run):
    """The gate's arithmetic on a real record: every cell's CPU speedup as a round 15 % slower makes it
    (baseline decoding unchanged: the ratio falls by 1/1.15) fails on the pooled figure alone; 5 % slower,
    inside the noise the threshold allows, passes. Deterministic: the timing is edited, not measured."""
    first, base = baseline_run

    def slowed(factor: float) -> dict:
        record = first.to_json()
        for cell in record["cells"]:
            cell["cpu_speedup"] = float(cell["cpu_speedup"]) / factor
        return record

    report = compare(base, slowed(1.15), gate_cpu=True)
    assert [f.key for f in report.regressions] == ["gate/trained/k4/cpu_speedup"], report.regressions
    assert compare(base, slowed(1.05), gate_cpu=True).passed
    assert compare(base, slowed(1.15)).passed  # by default reported, not gated


@pytest.mark.parametrize("where", ["proposal", "verify"])
def test_real_slower_round_is_caught_end_to_end(baseline_run, where):
    """A round made half again as slow (CPU burned in the proposal or in the verify forward) by a real
    run: the counts are unchanged, the pooled CPU ratio drops beyond its threshold.

    Half, not 15 %: a 15 % slower round moves the pooled figure 13-17 % against a 10 % threshold, and
    a timed unit test on a shared 2-core runner does not hold that margin every time (one CI run saw
    the 15 % proposal case pass the gate). The 15 % sensitivity is a benchmark's claim, measured by
    ``benchmarks/gate_sensitivity.py`` (docs/bench.md); this test proves the measured path end to end."""
    first, base = baseline_run
    delay = 0.5 * round_cpu_seconds(first.to_json())
    if where == "proposal":
        result = run_bench(_tiny_config(), drafter_factory=slow_proposal(delay))
    else:
        result = run_bench(_tiny_config(), decoder_factory=slow_verify(delay))
    regressed = compare(base, result.to_json(), gate_cpu=True).regressions
    assert "gate/trained/k4/cpu_speedup" in {f.key for f in regressed}, [(f.key, f.change) for f in regressed]
    assert not [f for f in regressed if f.kind == "machine_independent"]  # the same rounds, only slower


def test_injectors_validate_their_delay():
    with pytest.raises(InvalidSettingError, match="injected delay"):
        slow_proposal(-1.0)
    with pytest.raises(InvalidSettingError, match="no cells with CPU times"):
        round_cpu_seconds({"cells": []})


# --------------------------------------------------------------------------- drafter comparison and peers


def test_drafter_comparison_cells_and_their_gated_figures():
    config = BenchConfig(
        mode="quick",
        companions=(),
        workloads=("code-edit",),
        rollbacks=("checkpoint",),
        prompt_chars=400,
        chunks=4,
        verify_reps=3,
        drafter_contexts=(1024, 2048),
        drafter_reps=20,
        real_files=1,
        real_tokens=384,
        real_stride=64,
        peers=False,
        batch_sizes=(),
    )
    result = run_bench(config)
    base = make_baseline(result.to_json())
    cells = {c.drafter: c for c in result.drafter_cells}
    assert {"ngram", "model:trained-small", "combined:trained-small"} <= set(cells)
    assert all(c.lossless and c.workload == "code-edit" and c.k == 4 for c in cells.values())
    lookup, model = cells["ngram"], cells["model:trained-small"]
    assert lookup.draft_forwards_per_round == 0 and lookup.projected_speedup == lookup.projected_speedup_target_only
    # a draft model is charged its bytes: the projection drops below the target-only figure
    assert 0.05 < model.draft_bytes_ratio < 0.2
    assert model.projected_speedup < model.projected_speedup_target_only
    assert 1 <= model.draft_forwards_per_round <= 4  # one catch-up + k - 1 one-token forwards at most
    assert model.proposal_cost > 0 and len(model.acceptance_by_position) == 4
    assert 0.0 <= lookup.distinct_4gram_share <= 1.0 and lookup.degenerate == (lookup.distinct_4gram_share < 0.5)
    keys = [k for k in base["figures"] if k.startswith("drafters/")]
    assert len(keys) == len(cells) * 2 and all(base["figures"][k]["kind"] == "machine_independent" for k in keys)
    data = result.to_json()
    assert len(data["drafter_cells"]) == len(cells)
    # every compared drafter is judged on real contexts too, and gated there
    real = {c["drafter"]: c for c in data["real_contexts"]["cells"]}
    assert set(real) == set(cells) and data["real_contexts"]["positions"] == len(range(128, 384, 64))
    assert all(1.0 <= c["tokens_per_round"] <= 5.0 for c in real.values())
    assert {f"real/trained/{d}/k4/tokens_per_round" for d in cells} <= set(base["figures"])
    skipped = {d["drafter"] for d in data["drafters_skipped"]}
    assert skipped | {d for d in cells if d in OPTIONAL_DRAFTERS} == set(OPTIONAL_DRAFTERS)


def test_peer_comparison_is_warm_alternating_and_reports_spread():
    from specproof.bench._peers import _compare_engines
    from specproof.bench._render import peer_lines
    from specproof.engine import greedy_decode
    from specproof.plugins import load_target

    calls: list[int] = []
    peer_target = load_target("reference:d_model=32,max_context=512")

    def peer_generate(prompt, n):  # type: ignore[no-untyped-def]
        calls.append(n)
        return greedy_decode(peer_target, prompt, n).tokens

    config = BenchConfig(mode="quick", peer_tokens=64, peer_repeats=7, peers=True)
    target = load_target("reference:d_model=32,max_context=512")
    row = _compare_engines(config, target, peer_generate, NgramDrafter)
    assert row["status"] == "ok" and row["tokens"] == 64 and row["pairs"] == 7 and row["warmup"] == 1
    assert len(calls) == 1 + 7  # one warm-up, then one per pair
    assert row["ratio_min"] <= row["tokens_per_second_ratio"] <= row["ratio_max"]
    assert row["ratio_spread"] >= 0 and len(row["ratios"]) == 7 and row["outputs_equal"]
    assert row["specproof_forwards"] >= 1 and row["peer_forwards"] is None  # no torch model to count
    line = peer_lines({"peers": [{"peer": "p", "target": "t", **row}]})[0]
    assert "median" in line and "7 alternating pairs of 64 tokens" in line
    doc = make_baseline({**_result(), "peers": [{"peer": "p", "target": "t", **row}]})
    assert doc["peers"][0]["pairs"] == 7 and "ratios" not in doc["peers"][0]
    assert compare(doc, _result()).passed  # informational: never gated
