"""The families' real-model features in the export: LFM2-MoE's expert bias, Qwen3-Next's shared-expert gate
and attention output gate.

A bundle exported with one of them left out (a test-only planted bug) is a self-consistent other model:
its own chunked and one-token forwards agree, so certifying it against itself passes. ``bundle check
--against`` on the family source rejects each; the correct exports pass it (tests/coreml/test_coreml_check.py,
test_coreml_unified_kv.py and test_coreml_multifunction.py run them in every layout).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")

from specproof.coreml import CheckOptions, MilEvaluator, check_bundle, export_bundle, family_target  # noqa: E402
from specproof.engine.targets.coreml_eval import CoreMLEvalTarget  # noqa: E402

QUICK = CheckOptions(examples=20)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("features")


def _export(root: Path, family: str, planted: str | None) -> Path:
    path = root / f"{family}-{planted or 'ok'}.mlpackage"
    if not path.exists():
        export_bundle(
            path, family_target(family), k=4, layout="kv-mlstate", gdn="loop", target_spec=f"family:{family}",
            _planted=planted,
        )  # fmt: skip
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("planted", "family"),
    [("expert-bias-ignored", "lfm2-moe"), ("shared-gate-ignored", "qwen3.6-moe"),
     ("attn-gate-ignored", "qwen3.6-moe")],
)  # fmt: skip
def test_an_export_leaving_a_feature_out_is_rejected_against_its_source(root: Path, planted: str, family: str) -> None:
    path = _export(root, family, planted)
    report = check_bundle(path, family_target(family), against=family, options=QUICK)
    failed = {r.id: r.detail for r in report.results if r.status == "fail"}
    assert report.verdict == "fail" and "bundle.logits" in failed, [r.to_json() for r in report.results]
    assert "max |logit difference|" in failed["bundle.logits"]
    # it agrees with itself: only the comparison with the source sees it
    t = CoreMLEvalTarget(path)
    whole = t.forward([1, 2, 3, 4, 5])
    t.reset()
    np.testing.assert_array_equal(whole, np.concatenate([t.forward([tok]) for tok in (1, 2, 3, 4, 5)]))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["lfm2-moe", "qwen3.6-moe"])
def test_the_export_writes_the_features_ops_and_passes(root: Path, family: str) -> None:
    path = _export(root, family, None)
    report = check_bundle(path, family_target(family), against=family, options=QUICK)
    assert report.verdict == "pass", [r.to_json() for r in report.results]
    assert all(r.exercised > 0 for r in report.results)
    ev = MilEvaluator(path)
    assert "sigmoid" in ev.op_types  # the router's scores (lfm2-moe), the gates (qwen3.6-moe)
    if family == "qwen3.6-moe":
        assert "split" in ev.op_types  # q_proj's [query | gate] halves per head
