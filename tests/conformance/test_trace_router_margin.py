"""``check-trace --target SPEC --router-margin M``: a divergence after a row the oracle routes by less than ``M``.

A lower-precision engine (an fp16 Core ML bundle) may route such a row otherwise, and every later token may
then legitimately differ: the verdict is ``excused``, by the rule ``bundle check`` applies
(``engine.row_router_margins``). The same divergence fails at ``M`` = 0 (exact routing), at an ``M`` below
the smallest router margin of the rows before it, and on an oracle that reports no router margins.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

import specproof.cli as cli
from _targets import small_target
from specproof.conformance.traces import check_trace, read_trace, write_trace
from specproof.engine import InvalidSettingError, greedy_decode, row_router_margins
from specproof.plugins import load_target

PROMPT = list(b"The quick brown fox")
INDEX = 5  # the token the trace changes


def _changed_trace(path: Path, target: object, name: str) -> object:
    """Plain greedy on ``target`` with token ``INDEX`` changed (in its round and the output): a trace only an
    oracle can fault."""
    gen = greedy_decode(target, PROMPT, 8, eos_token_id=None)  # type: ignore[arg-type]
    new = (gen.tokens[INDEX] + 1) % target.vocab_size  # type: ignore[attr-defined]
    steps = list(gen.steps or ())
    steps[INDEX] = attrs.evolve(steps[INDEX], argmax=(new,), accepted=(new,))
    tokens = [*gen.tokens[:INDEX], new, *gen.tokens[INDEX + 1 :]]
    changed = attrs.evolve(gen, tokens=tokens, steps=tuple(steps))
    write_trace(
        path, changed, prompt=PROMPT, k=1, max_new_tokens=8, eos_token_id=None,
        vocab_size=target.vocab_size, engine="changed", target=name,  # type: ignore[attr-defined]
        max_context=target.max_context,  # type: ignore[attr-defined]
    )  # fmt: skip
    return read_trace(path)


def _smallest_margin_before(target: object) -> float:
    """The oracle's smallest router margin over the rows that led to token ``INDEX``."""
    gen = greedy_decode(target, PROMPT, INDEX, eos_token_id=None)  # type: ignore[arg-type]
    context = [*PROMPT, *gen.tokens]
    target.reset()  # type: ignore[attr-defined]
    target.forward(context)  # type: ignore[attr-defined]
    return float(row_router_margins(target, len(context)).min())


def test_a_divergence_after_a_router_near_tie_is_excused(tmp_path: Path) -> None:
    source = load_target("family:qwen3.6-moe")
    trace = _changed_trace(tmp_path / "t.jsonl", source, "family:qwen3.6-moe")
    smallest = _smallest_margin_before(source)
    assert 0 < smallest < 0.5  # this prompt meets a near-tie before the changed token (the precondition)
    exact = check_trace(trace, target=source).result("engine.lossless")  # type: ignore[arg-type]
    assert exact.status == "fail" and f"token {INDEX} differs" in exact.detail
    report = check_trace(trace, target=source, router_margin=0.5)  # type: ignore[arg-type]
    lossless = report.result("engine.lossless")
    assert lossless.status == "excused" and "router near-tie" in lossless.detail and report.exit_code == 0
    below = check_trace(trace, target=source, router_margin=smallest / 2)  # type: ignore[arg-type]
    assert below.result("engine.lossless").status == "fail"


def test_an_oracle_without_router_margins_excuses_nothing(tmp_path: Path) -> None:
    dense = small_target(vocab_size=256)
    trace = _changed_trace(tmp_path / "t.jsonl", dense, "small")
    assert check_trace(trace, target=dense, router_margin=10.0).result("engine.lossless").status == "fail"


def test_bad_router_margins_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = load_target("family:qwen3.6-moe")
    trace = _changed_trace(tmp_path / "t.jsonl", source, "family:qwen3.6-moe")
    for bad in (-0.5, float("nan"), True):
        with pytest.raises(InvalidSettingError, match="router_margin"):
            check_trace(trace, target=source, router_margin=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match="needs a target oracle"):
        check_trace(trace, greedy_tokens=[1, 2, 3], router_margin=0.5)  # type: ignore[arg-type]
    path = str(tmp_path / "t.jsonl")
    assert cli.main(["check-trace", path, "--router-margin", "0.5"]) == 2
    assert "--router-margin needs --target" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["check-trace", path, "--target", "family:qwen3.6-moe", "--router-margin", "-1"])
    assert exc.value.code == 2
