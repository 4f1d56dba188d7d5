"""The sampled real-context figures (issue 28): acceptance and tokens per round at T = 0.7 and 1.0 beside greedy's,
by rejection sampling with fixed seeds; reported in the result, the text and the docs, never gated."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from specproof.bench import BenchConfig, figures, run_bench
from specproof.bench._doc import figures_block
from specproof.bench._real import RealContextText
from specproof.bench._sampled import measure_sampled_contexts
from specproof.bench.cli_support import real_context_lines, sampled_context_lines
from specproof.contract import SampledDraft, SamplingParams, processed_distribution
from specproof.engine import InvalidSettingError, NgramDrafter
from specproof.formats import validate
from specproof.plugins import load_target

TARGET_SPEC = "reference:d_model=32,max_context=512"
K = 4


def _texts() -> list[RealContextText]:
    text = tuple(b"def f(x):\n    return x + 1\n\ndef g(y):\n    return f(y) * 2\n" * 3)
    return [RealContextText(source="inline", tokens=text, positions=tuple(range(12, len(text) - 6, 9)))]


class _TargetSampler:
    """Correct, and the best a drafter can be: samples each token from the target's own p (its own copy of the
    target, the contract's processed distribution) and declares it: rejection sampling keeps every token."""

    name = "target-sampler"

    def __init__(self) -> None:
        self.target = load_target(TARGET_SPEC)

    def _rows(self, context: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator) -> Any:
        self.target.reset()
        row = np.asarray(self.target.forward(list(context)))[-1]
        tokens, rows = [], []
        for _ in range(k):
            q = processed_distribution(row, sampling)
            tokens.append(int(rng.choice(len(q), p=q)))
            rows.append(q)
            row = np.asarray(self.target.forward([tokens[-1]]))[-1]
        return tokens, rows

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        raise AssertionError("a sampled measurement calls propose_sampled")

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft:
        tokens, rows = self._rows(context, k, sampling, rng)
        return SampledDraft(tokens, np.stack(rows))


class _FirstOnly(_TargetSampler):
    """The first token from the target's p; then, declared one-hot, the token the target finds least likely."""

    name = "first-only"

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft:
        tokens, rows = self._rows(context, 1, sampling, rng)
        self.target.reset()
        row = np.asarray(self.target.forward([*context, tokens[0]]))[-1]
        worst = int(np.argmin(row))
        hot = np.zeros_like(rows[0])
        hot[worst] = 1.0
        return SampledDraft([tokens[0], *[worst] * (k - 1)], np.stack([rows[0], *[hot] * (k - 1)]))


class _AtTemperatureOne(_TargetSampler):
    """Samples the target's p at temperature 1 whatever the request says (and declares that q): exact at T = 1,
    off at any other temperature, where rejection sampling keeps only part of its drafts."""

    name = "at-temperature-one"

    def propose_sampled(
        self, context: Sequence[int], k: int, *, sampling: SamplingParams, rng: np.random.Generator
    ) -> SampledDraft:
        return super().propose_sampled(context, k, sampling=SamplingParams(temperature=1.0), rng=rng)


def _measure(drafters: Any, **kw: Any) -> dict[tuple[str, float], Any]:
    cells = measure_sampled_contexts(TARGET_SPEC, load_target(TARGET_SPEC), drafters, _texts(), k=K, **kw)
    return {(c.drafter, c.temperature): c for c in cells}


def test_rejection_sampling_keeps_a_draft_from_the_targets_own_p_and_rejects_what_it_finds_unlikely() -> None:
    n = len(_texts()[0].positions)
    cells = _measure([("target", _TargetSampler), ("first", _FirstOnly), ("ngram", NgramDrafter)], seeds=3)
    for t in (0.7, 1.0):
        best, first, lookup = cells["target", t], cells["first", t], cells["ngram", t]
        assert best.rounds == 3 * n and best.positions == n and best.seeds == 3 and best.scheme == "rejection"
        assert best.tokens_per_round == K + 1 and best.acceptance_by_position == (1.0,) * K
        assert best.attempts_by_position == (3 * n,) * K and best.q == "declared"
        assert first.acceptance_by_position[0] == 1.0 and first.acceptance_by_position[1] < 0.05
        assert first.attempts_by_position[0] == first.attempts_by_position[1] == 3 * n  # the rest is rarely reached
        assert 1.0 <= lookup.tokens_per_round < K + 1 and lookup.q == "one-hot"
        assert best.key == f"{TARGET_SPEC}/target/k4/T{t:g}"


def test_the_figures_are_reproducible_and_move_with_the_seeds_and_temperature() -> None:
    specs = [("ngram", NgramDrafter), ("one", _AtTemperatureOne)]
    a, b = _measure(specs, seeds=2), _measure(specs, seeds=2)
    assert {k: c.to_json() for k, c in a.items()} == {k: c.to_json() for k, c in b.items()}
    more = _measure(specs, seeds=5)
    assert more["ngram", 0.7].rounds == 5 * a["ngram", 0.7].positions
    assert more["one", 0.7].to_json() != a["one", 0.7].to_json()
    assert a["one", 1.0].tokens_per_round == K + 1  # its q is the target's p at T = 1: every token kept
    assert 1.0 < a["one", 0.7].tokens_per_round < K + 1  # at T = 0.7 its q is not p: some rejected


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"temperatures": (0.0,)}, "must be above 0"),
        ({"temperatures": (-1.0,)}, "temperature=-1.0 must be in"),
        ({"seeds": 0}, "seeds=0 must be an integer >= 1"),
    ],
)
def test_bad_sampled_settings_are_errors_naming_them(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        _measure([("ngram", NgramDrafter)], **kw)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("real_temperatures", (0.0,), "real_temperatures"), ("real_seeds", 0, "real_seeds")],
)
def test_bench_config_validates_the_sampled_settings(field: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        BenchConfig(mode="quick", **{field: value})


@pytest.fixture(scope="module")
def sampled_run() -> dict[str, Any]:
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
        drafters=("ngram", "model:trained-small"),
        optional_drafters=False,
        real_files=1,
        real_tokens=320,
        real_stride=48,
        real_min_prefix=64,
        peers=False,
        batch_sizes=(),
    )
    return json.loads(json.dumps(run_bench(config).to_json()))


def test_a_bench_run_reports_sampled_figures_beside_greedy_and_the_gate_does_not_read_them(
    sampled_run: dict[str, Any],
) -> None:
    assert validate("bench-2", sampled_run) == []
    real = sampled_run["real_contexts"]
    sampled = real["sampled"]
    assert sampled["temperatures"] == [0.7, 1.0] and sampled["seeds"] == 2 and sampled["scheme"] == "rejection"
    cells = {(c["drafter"], c["temperature"]): c for c in sampled["cells"]}
    assert set(cells) == {(d, t) for d in ("ngram", "model:trained-small") for t in (0.7, 1.0)}
    positions = real["positions"]
    for c in cells.values():
        assert c["rounds"] == 2 * positions and 1.0 <= c["tokens_per_round"] <= 5.0
    assert cells["model:trained-small", 0.7]["q"] == "declared" and cells["ngram", 1.0]["q"] == "one-hot"
    assert cells["model:trained-small", 0.7]["acceptance_by_position"][0] > 0  # the trained pair agrees sometimes
    # the gate: exactly the figures of the same run without the sampled section
    without = {**sampled_run, "real_contexts": {k: v for k, v in real.items() if k != "sampled"}}
    assert figures(sampled_run) == figures(without)
    assert not any("T0.7" in key or "T1" in key for key in figures(sampled_run))
    bad = json.loads(json.dumps(sampled_run))
    bad["real_contexts"]["sampled"]["cells"][0]["q"] = "maybe"
    assert validate("bench-2", bad)  # the schema reads the optional section


def test_the_text_and_the_doc_show_sampled_beside_greedy_only_when_measured(sampled_run: dict[str, Any]) -> None:
    lines = sampled_context_lines(sampled_run)
    assert lines and lines == real_context_lines(sampled_run)[-len(lines) :]
    assert "T=0.7" in lines[0] and "T=1" in lines[0] and "rejection" in lines[0]
    greedy = {c["drafter"]: c["tokens_per_round"] for c in sampled_run["real_contexts"]["cells"]}
    row = next(line for line in lines if "model:trained-small" in line)
    assert f"{greedy['model:trained-small']:5.2f}" in row and "declared" in row
    block = figures_block(sampled_run, source="run.json")
    assert "| drafter | q | greedy | T = 0.7 | T = 1 |" in block
    assert block.count("| model:trained-small | declared |") == 1
    real = sampled_run["real_contexts"]
    plain = {**sampled_run, "real_contexts": {k: v for k, v in real.items() if k != "sampled"}}
    assert sampled_context_lines(plain) == [] and "T = 0.7" not in figures_block(plain, source="run.json")
