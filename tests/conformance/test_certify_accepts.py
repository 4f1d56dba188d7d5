"""Meta-tests: certification ACCEPTS correct implementations that differ from specproof's own.

A gate that rejects a correct drafter because it breaks n-gram ties the other way,
never drafts, or returns numpy arrays, or a target whose batched kernel rounds
differently from its one-token kernel, would be switched off. These run the real
certification (``specproof.conformance.certify``, the same path as ``specproof certify``)
on the implementations in ``tests/_good_implementations.py``.

The stateful rollback machine is skipped for drafter subjects (``--only 'drafter.*,engine.*'``):
it drives its own scripted drafts, so it does not exercise the
drafter, and it is the slow part of a run.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from _good_implementations import EarliestNgramDrafter, NumpyArrayDrafter
from specproof.cli import main
from specproof.conformance import certify
from specproof.engine import NgramDrafter

GOOD = "_good_implementations"


def _certify(kind: str, spec: str, *, only: tuple[str, ...] = (), **options: Any) -> dict[str, Any]:
    return certify(kind, **{kind: spec}, profile="quick", only=only, **options).to_json()


def _not_passing(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [
        (r["invariant"], r["case"], r["status"], r["detail"])
        for r in report["results"]
        if r["status"] not in ("pass", "excused")
    ]


@pytest.mark.parametrize("factory", ["earliest_ngram", "never_drafts", "numpy_drafts"])
def test_correct_drafters_are_accepted(factory: str) -> None:
    report = _certify("drafter", f"{GOOD}:{factory}", only=("drafter.*", "engine.*"))
    assert report["verdict"] == "pass", _not_passing(report)
    ran = {r["invariant"] for r in report["results"] if r["status"] in ("pass", "excused")}
    # every drafter invariant and every engine invariant was really checked, on both rollbacks
    assert {"drafter.max-length", "drafter.token-range", "drafter.deterministic", "drafter.no-mutation"} <= ran
    assert {"engine.lossless", "engine.accept-rule", "engine.kv-length", "engine.state-restored"} <= ran
    assert {r["case"] for r in report["results"] if r["invariant"] == "engine.lossless"} == {"checkpoint", "replay"}
    assert all(r["examples"] > 0 for r in report["results"] if r["status"] == "pass")


def test_earliest_ngram_really_breaks_ties_the_other_way() -> None:
    """The accepted drafter is not a copy of NgramDrafter: on a repeated n-gram they disagree."""
    context = [1, 2, 3, 1, 2, 4, 1, 2]  # "1 2" was followed by 3, later by 4
    assert EarliestNgramDrafter().propose(context, 2) == [3, 1]
    assert NgramDrafter().propose(context, 2) == [4, 1]


def test_numpy_drafter_returns_arrays() -> None:
    draft = NumpyArrayDrafter().propose([5, 6, 5], 3)
    assert isinstance(draft, np.ndarray) and draft.dtype == np.int32 and draft.tolist() == [6, 5]


def test_rounding_target_is_accepted_within_its_tolerance(tmp_path: Any) -> None:
    """``specproof certify target --target MODULE:ATTR`` exits 0; the tolerance comes from ``tie_tolerance``."""
    out = tmp_path / "report.json"
    args = ["certify", "target", "--target", f"{GOOD}:rounding_target", "--profile", "quick", "--report", str(out)]
    code = main(args)
    report = json.loads(out.read_text())
    assert code == 0, _not_passing(report)
    assert report["verdict"] == "pass"
    # read from the target's tie_tolerance attribute (and used as atol too: it declares no atol)
    assert report["subjects"]["target"]["tie_tolerance"] == pytest.approx(1e-4)
    assert report["subjects"]["target"]["atol"] == pytest.approx(1e-4)
    statuses = {(r["invariant"], r["case"]): r["status"] for r in report["results"]}
    assert statuses[("target.chunk-invariance", "target")] == "pass"
    # the built-in engine ran on it with both rollbacks, and the stateful machine too
    assert statuses[("engine.lossless", "checkpoint")] in ("pass", "excused")
    assert statuses[("engine.state-restored", "replay")] == "pass"
    assert statuses[("stateful.rollback-machine", "checkpoint+replay")] == "pass"


def test_rounding_target_noise_is_real() -> None:
    """The same target fails chunk-invariance at tolerance 0: the acceptance above is not vacuous."""
    report = _certify("target", f"{GOOD}:rounding_target", only=("target.chunk-invariance",), atol=0.0)
    assert report["verdict"] == "fail"
    (result,) = [r for r in report["results"] if r["invariant"] == "target.chunk-invariance"]
    assert result["status"] == "fail"
    assert "atol 0" in result["violations"][0]["explanation"]
