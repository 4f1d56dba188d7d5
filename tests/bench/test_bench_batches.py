"""The bench's batch figures (``_batches``): the batched reference decoder beside the single-request engine.

A broken batch (a request's tokens changed) is reported not lossless and fails the bench; a worse
drafter fails the gate on the batch counts; a correct but different run (a drafter that proposes
nothing) is lossless, with one token a round on both sides.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

import specproof.bench as bench
from specproof.bench import BenchConfig, _batches, compare, figures, make_baseline, run_bench
from specproof.bench._batches import BatchFigures
from specproof.bench._counting import default_decoder
from specproof.bench._doc import figures_block
from specproof.bench._protocol import BenchRun
from specproof.bench._workloads import build_workloads
from specproof.bench.cli_support import batch_lines
from specproof.cli import main
from specproof.contract import Generation
from specproof.contract.errors import InvalidSettingError
from specproof.engine import NgramDrafter
from specproof.formats import bench as bench_format

TARGET = "trained"  # the trained fixture: prompt lookup is accepted there, so counts can drop


def _config(**over: Any) -> BenchConfig:
    # one workload, one short cell: the batch figures are what these tests read
    fields: dict[str, Any] = dict(
        mode="quick",
        target=TARGET,
        companions=(),
        workloads=("code-edit",),
        rollbacks=("checkpoint",),
        prompt_chars=200,
        chunk_tokens=4,
        chunks=2,
        verify_reps=1,
        drafter_contexts=(64, 128),
        drafter_reps=2,
        drafters=(),
        real_files=0,
        peers=False,
        batch_sizes=(1, 3),
        batch_tokens=12,
    )
    fields.update(over)
    return BenchConfig(**fields)


class _Silent:
    """A correct drafter that never drafts: every round verifies one token."""

    name = "silent"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return []


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    return json.loads(json.dumps(run_bench(_config()).to_json()))


@pytest.fixture(scope="module")
def silent() -> dict[str, Any]:
    return run_bench(_config(), drafter_factory=_Silent).to_json()


@pytest.mark.slow
def test_the_batch_figures_sit_beside_the_single_engine_and_are_gated_as_counts(run: dict[str, Any]) -> None:
    bench_format.FORMAT.validate(run)
    batches = run["batches"]
    assert batches["status"] == "ok" and batches["tokens"] == 12 and batches["k"] == 4
    cells = {c["batch"]: c for c in batches["cells"]}
    assert set(cells) == {1, 3}
    for size, cell in cells.items():
        assert cell["lossless"] and cell["emitted"] == 12 * size == cell["single"]["emitted"]
        # each row's round is its solo round: the same counts on both sides
        assert cell["tokens_per_round"] == cell["single"]["tokens_per_round"]
        assert cell["rounds"] == cell["single"]["rounds"]
        assert cell["tokens_per_second"] > 0 and cell["single"]["tokens_per_second"] > 0
    assert cells[1]["forwards_per_token"] == cells[1]["single"]["forwards_per_token"]
    # three rows share a verify step: fewer verify forwards per token than alone
    assert cells[3]["forwards_per_token"] < cells[3]["single"]["forwards_per_token"]
    assert cells[3]["rows_per_step"] > 1
    gated = {k: v for k, v in figures(run).items() if k.startswith("batches/")}
    assert set(gated) == {
        f"batches/{TARGET}/b{b}/{name}" for b in (1, 3) for name in ("tokens_per_round", "forwards_per_token")
    }
    assert {v["kind"] for v in gated.values()} == {"machine_independent"}
    assert compare(make_baseline(run), run).passed
    lines = batch_lines(run)
    assert len(lines) == 3 and "batch 3" in lines[2] and lines[2].endswith("yes")
    rows = [line for line in figures_block(run, source="run.json").splitlines() if line.startswith("| 3 |")]
    assert len(rows) == 1 and rows[0].endswith("| yes |")


@pytest.mark.slow
def test_a_worse_drafter_fails_the_gate_on_the_batch_counts(run: dict[str, Any], silent: dict[str, Any]) -> None:
    report = compare(make_baseline(run), silent)
    regressed = {f.key for f in report.regressions}
    assert f"batches/{TARGET}/b3/tokens_per_round" in regressed
    assert f"batches/{TARGET}/b3/forwards_per_token" in regressed


@pytest.mark.slow
def test_a_drafter_that_never_drafts_is_lossless_at_one_token_a_round(silent: dict[str, Any]) -> None:
    for cell in silent["batches"]["cells"]:
        assert cell["lossless"] and cell["tokens_per_round"] == 1.0 == cell["single"]["tokens_per_round"]


@pytest.mark.slow
def test_a_batch_that_changes_a_request_is_not_lossless_and_fails_the_bench(
    run: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_run_batch = _batches.run_batch

    def broken(engine: Any, requests: Any, *, max_steps: int) -> dict[str, Generation]:
        done = real_run_batch(engine, requests, max_steps=max_steps)
        last = requests[-1].request_id
        tokens = list(done[last].tokens)
        tokens[-1] = (tokens[-1] + 1) % 256
        done[last] = attrs.evolve(done[last], tokens=tuple(tokens))
        return done

    monkeypatch.setattr(_batches, "run_batch", broken)
    data = run_bench(_config(batch_sizes=(2,))).to_json()
    assert [c["lossless"] for c in data["batches"]["cells"]] == [False]
    assert batch_lines(data)[1].endswith("NO")

    class _Fake:
        def to_json(self) -> dict[str, Any]:
            return copy.deepcopy(data)

    class _FakeConfig:
        @staticmethod
        def quick(*, target: str) -> BenchConfig:
            return _config()

    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: _Fake())
    monkeypatch.setattr(bench, "BenchConfig", _FakeConfig)
    assert main(["bench", "--quick", "--target", TARGET]) == 1
    assert "the batch of 2 was not lossless" in capsys.readouterr().err
    good = copy.deepcopy(run)
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: type("F", (), {"to_json": lambda self: good})())
    assert main(["bench", "--quick", "--target", TARGET]) == 0
    assert "batch 3" in capsys.readouterr().out


def test_a_target_the_slot_pool_cannot_copy_is_a_skip_with_the_reason() -> None:
    class _Opaque:
        vocab_size, max_context, name = 256, 512, "opaque"

    config = _config()
    bench_run = BenchRun(
        config=config,
        workloads=tuple(build_workloads(config.workloads, prompt_chars=config.prompt_chars)),
        drafters=(),
        drafters_skipped=(),
        drafter_factory=NgramDrafter,
        decoder_factory=default_decoder,
        tick=lambda _msg: None,
        _pairs={TARGET: (_Opaque(), _Opaque())},
    )
    section = BatchFigures().measure(bench_run)["batches"]
    assert section["status"] == "skip" and "reference-family target" in section["reason"]
    assert batch_lines({"batches": section}) == [f"batches: not measured ({section['reason']})"]
    empty = BatchFigures().measure(attrs.evolve(bench_run, config=_config(batch_sizes=())))["batches"]
    assert empty["status"] == "skip" and "batch_sizes is empty" in empty["reason"]


@pytest.mark.parametrize(("field", "value"), [("batch_sizes", (0,)), ("batch_sizes", (2, True)), ("batch_tokens", 0)])
def test_bad_batch_settings_are_refused_with_the_field_named(field: str, value: object) -> None:
    with pytest.raises(InvalidSettingError, match=f"BenchConfig.{field}"):
        _config(**{field: value})
