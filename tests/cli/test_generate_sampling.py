"""`specproof generate --sampling ... --scheme ...` (issue 28): sampled generations on the command line, their
summary (`specproof-generate/1`, optional `sampling`/`scheme`/`drafter_q`), and the usage errors that come
before any work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specproof.cli import main
from specproof.contract import Generation, SamplingParams
from specproof.engine import NgramDrafter, SpecDecoder
from specproof.formats import validate
from specproof.plugins import load_target

BASE = ["generate", "--target", "trained", "--max-new-tokens", "24", "--json"]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 0) -> dict[str, Any]:
    assert main(argv) == code
    out = json.loads(capsys.readouterr().out)
    assert validate("generate-1", out) == []
    return out  # type: ignore[no-any-return]


@pytest.mark.parametrize("drafter", ["model:trained-small", "combined:trained-small", "eagle:trained"])
@pytest.mark.parametrize("scheme", ["rejection", "match"])
def test_a_seeded_sampled_generation_says_how_it_sampled_and_reproduces(
    drafter: str, scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*BASE, "--drafter", drafter, "--scheme", scheme, "--sampling"]
    a = _json(capsys, [*argv, "temperature=0.8,top_p=0.95,seed=7"])
    assert a["sampling"] == {"temperature": 0.8, "top_k": 0, "top_p": 0.95, "min_p": 0.0, "seed": 7}
    assert a["scheme"] == scheme and a["drafter_q"] == "declared"
    assert len(a["tokens"]) == 24 and a["rounds"] < 24  # drafts were kept
    assert _json(capsys, [*argv, "temperature=0.8,top_p=0.95,seed=7"])["tokens"] == a["tokens"]
    assert _json(capsys, [*argv, "temperature=0.8,top_p=0.95,seed=8"])["tokens"] != a["tokens"]


def test_without_a_seed_one_is_drawn_reported_and_reproduces(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*BASE, "--drafter", "model:trained-small", "--sampling"]
    a = _json(capsys, [*argv, "temperature=1.0,top_k=40,min_p=0.02"])
    seed = a["sampling"]["seed"]
    assert isinstance(seed, int) and seed >= 0 and a["scheme"] == "rejection"
    again = _json(capsys, [*argv, f"temperature=1.0,top_k=40,min_p=0.02,seed={seed}"])
    assert again["tokens"] == a["tokens"]


def test_a_deterministic_drafter_is_one_hot_and_greedy_runs_say_sampling_null(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sampled = _json(capsys, [*BASE, "--drafter", "ngram", "--sampling", "temperature=0.7,seed=1"])
    assert sampled["drafter_q"] == "one-hot"
    greedy = _json(capsys, [*BASE, "--drafter", "ngram"])
    assert greedy["sampling"] is None and "scheme" not in greedy and "drafter_q" not in greedy


@pytest.mark.parametrize("text", ["temperature=0", "temperature=0.9,top_k=1"])
def test_greedy_sampling_equals_greedy_and_may_compare_and_trace(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    out = _json(
        capsys,
        [*BASE, "--drafter", "model:trained-small", "--sampling", text, "--compare-greedy", "--trace", str(trace)],
    )
    assert out["equal_to_greedy"] is True and trace.exists()


def test_the_text_summary_names_the_parameters_scheme_and_q(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--target", "trained", "--max-new-tokens", "8", "--drafter", "mtp:trained"]
    assert main([*argv, "--sampling", "temperature=0.7,top_p=0.9,seed=3", "--scheme", "match"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "temperature=0.7,top_p=0.9,seed=3" in out and "scheme match" in out and "declared" in out
    assert main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "sampling" in line]
    assert len(rows) == 1 and "greedy" in rows[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sampling", "temperature=abc"], "temperature='abc' must be a finite decimal number"),
        (["--sampling", "temp=1"], "'temp=1' is not NAME=VALUE"),
        (["--sampling", "top_p=0.9"], "give temperature=T"),
        (["--sampling", "temperature=-1"], "temperature=-1.0 must be in"),
        (["--sampling", "temperature=1,top_p=0"], "top_p=0.0 must be in (0, 1]"),
        (["--sampling", "temperature=1,seed=1,seed=2"], "seed is given twice"),
        (["--scheme", "match"], "give --sampling too"),
        (["--sampling", "temperature=0.8", "--compare-greedy"], "--compare-greedy compares with greedy"),
        (["--sampling", "temperature=0.8", "--trace", "TRACE"], "--trace records a greedy generation"),
    ],
)
def test_bad_sampling_options_are_one_line_usage_errors_before_any_work(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import specproof.plugins

    def no_work(*_a: object, **_k: object) -> None:
        raise AssertionError("a drafter was loaded before the usage error")

    monkeypatch.setattr(specproof.plugins, "load_drafter", no_work)
    trace = tmp_path / "t.jsonl"
    argv = ["generate", "--max-new-tokens", "4", *(str(trace) if a == "TRACE" else a for a in extra)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert not trace.exists()


# --------------------------------------------------------------------------- --engine


class _SamplingEngine:
    """A SpecDecoder as an engine plug-in; it records the sampling it was handed."""

    def __init__(self, declare: bool) -> None:
        self.inner = SpecDecoder(load_target("reference"), NgramDrafter(), k=3)
        self.target = self.inner.target
        self.capabilities = ("sampling", "seeded") if declare else ()
        self.seen: list[SamplingParams | None] = []

    def generate(
        self, prompt: list[int], max_new_tokens: int, *, eos_token_id: int | None = None, **kw: Any
    ) -> Generation:
        self.seen.append(kw.get("sampling"))
        return self.inner.generate(prompt, max_new_tokens, eos_token_id=eos_token_id, **kw)


ENGINES: dict[str, _SamplingEngine] = {}


def sampling_engine() -> _SamplingEngine:
    ENGINES["yes"] = _SamplingEngine(True)
    return ENGINES["yes"]


def greedy_engine() -> _SamplingEngine:
    ENGINES["no"] = _SamplingEngine(False)
    return ENGINES["no"]


def test_an_engine_that_declares_sampling_gets_the_parameters_one_that_does_not_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["generate", "--ids", "1,2,3,4", "--max-new-tokens", "6", "--json", "--engine"]
    out = _json(capsys, [*argv, f"{__name__}:sampling_engine", "--sampling", "temperature=0.9,seed=4"])
    assert out["sampling"]["seed"] == 4 and ENGINES["yes"].seen == [SamplingParams(temperature=0.9, seed=4)]
    assert main([*argv, f"{__name__}:greedy_engine", "--sampling", "temperature=0.9"]) == 2
    err = capsys.readouterr().err
    assert "does not declare the 'sampling' capability" in err and ENGINES["no"].seen == []
    assert main([*argv, f"{__name__}:sampling_engine", "--sampling", "temperature=0.9", "--scheme", "match"]) == 2
    assert "an --engine samples by its own" in capsys.readouterr().err


def test_the_schema_takes_the_sampling_fields_and_rejects_wrong_ones() -> None:
    ok = {
        "format": "specproof-generate/1",
        "engine": "x",
        "prompt_tokens": 1,
        "tokens": [],
        "text": "",
        "stop_reason": "eos",
        "rounds": [],
        "seconds": 0.0,
    }
    assert validate("generate-1", ok) == []  # a summary from before sampling
    sampling = {"temperature": 0.8, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": None}
    assert validate("generate-1", {**ok, "sampling": sampling}) == []
    assert validate("generate-1", {**ok, "sampling": None}) == []
    assert validate("generate-1", {**ok, "sampling": {**sampling, "top_p": 0}})
    assert validate("generate-1", {**ok, "sampling": {**sampling, "beam": 2}})
    assert validate("generate-1", {**ok, "scheme": "rejection"})  # scheme is SpecDecoder's, not an engine's
