"""``target.matches-source`` (``certify target --oracle SPEC``): a target against the model it was converted from.

The check rejects a target of another model that agrees with itself (every other target
invariant passes it), accepts a target of the same model computed at a lower precision when
that target declares the tolerance it needs, and excuses rows after a router near-tie only
when the target declares a router margin. Bad ``--oracle`` input is a usage error before any work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specproof import cli
from specproof.conformance import get
from specproof.conformance.checks.target_source import check_matches_source
from specproof.engine import ReferenceHybrid
from specproof.engine.targets.reference_spec import load, load_moe
from specproof.formats import validate

INV = get("target.matches-source")
PREFIX, TOKENS, CHUNKS = [3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5], [2, 1]


class Fp16Logits:
    """The reference with its logits rounded to fp16: the same model at a lower precision (correct, different)."""

    def __init__(self, inner: ReferenceHybrid) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size

    def reset(self) -> None:
        self.inner.reset()

    def forward(self, tokens: list[int]) -> np.ndarray:
        return np.asarray(self.inner.forward(tokens), np.float16).astype(np.float32)


def _run(target: Any, source: Any, **tol: float) -> tuple[list[Any], int, str]:
    options = {"atol": 0.0, "rtol": 0.0, "router_margin": 0.0, **tol}
    return check_matches_source(INV, lambda: target, lambda: source, PREFIX, TOKENS, CHUNKS, **options)


def test_the_same_model_passes_every_row() -> None:
    violations, rows, note = _run(load(""), load(""))
    assert violations == [] and rows == len(PREFIX) + len(TOKENS) and "11 rows" in note


def test_another_model_fails_at_the_first_row() -> None:
    violations, rows, _ = _run(load(""), load("seed=1"))
    (v,) = violations
    assert rows == 0 and "position 0" in v.explanation and v.example["chunks"] == CHUNKS


def test_a_lower_precision_twin_passes_only_within_the_tolerance_it_declares() -> None:
    twin = Fp16Logits(load(""))
    assert _run(twin, load(""))[0] != []  # exact: fp16 rounding is seen
    violations, rows, _ = _run(twin, load(""), rtol=0.01)
    assert violations == [] and rows == len(PREFIX) + len(TOKENS)


def test_rows_after_a_router_near_tie_are_not_compared_nor_counted() -> None:
    source = load_moe("")
    source.reset()
    source.forward([*PREFIX, *TOKENS])
    margins = np.min(np.stack(source.last_router_margins), axis=0)
    cut = float(np.sort(margins)[len(margins) // 2])  # about half the rows lie beyond the first smaller margin
    first = int(np.argmax(margins < cut))
    other = load_moe("seed=1")
    violations, rows, note = _run(load_moe(""), load_moe(""), router_margin=cut)
    assert violations == [] and rows == first and f"{len(margins) - first} rows after a router margin" in note
    # a wrong model is still caught on the rows before the near-tie
    if first:
        assert _run(other, load_moe(""), router_margin=cut)[0] != []
    everything = _run(load_moe(""), load_moe(""), router_margin=float(margins[0]) + 1.0)
    assert everything[:2] == ([], 0) and "no row compared" in everything[2]


def _certify(*argv: str) -> int:
    return cli.main(["certify", "target", "--profile", "quick", "--only", "target.matches-source", *argv])


def test_certify_rejects_another_model_and_says_what_it_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _certify("--target", "reference", "--oracle", "reference:seed=1") == 1
    out = capsys.readouterr().out
    assert "target.matches-source" in out and "--oracle reference:seed=1" in out  # the reproduce line keeps it
    report = tmp_path / "r.json"
    assert _certify("--target", "reference", "--oracle", "reference", "--report", str(report)) == 0
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert validate("report-2", doc) == []
    assert doc["subjects"]["target"]["oracle"] == {"spec": "reference", "rtol": 0.0, "router_margin": 0.0}
    (result,) = doc["results"]
    assert result["status"] == "pass" and result["exercised"] > result["examples"]  # rows, not examples


def test_without_an_oracle_the_check_is_skipped_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert _certify("--target", "reference") == 3
    assert "no --oracle SPEC" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--oracle", "nosuch"], "--oracle 'nosuch'"),
        (["--oracle", "reference:vocab_size=100"], "vocab_size=100"),
    ],
)
def test_bad_oracles_are_usage_errors(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _certify("--target", "reference", *argv) == 2
    assert needle in capsys.readouterr().err


def test_an_oracle_belongs_to_certify_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["certify", "drafter", "--oracle", "reference"]) == 2
    assert "certify target" in capsys.readouterr().err
