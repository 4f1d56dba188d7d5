"""`certify target --target coreml-eval:PATH --oracle SPEC`: a bundle certified against its source model.

A bundle whose router keeps one expert where its source keeps two agrees with itself: every
self-comparing target invariant passes it. ``target.matches-source`` rejects it; correct exports
of both families pass it, at the tolerance the evaluator target declares against a float32 source.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

ct = pytest.importorskip("coremltools")

from specproof import cli  # noqa: E402
from specproof.coreml import export_bundle, family_target  # noqa: E402
from specproof.engine import ReferenceHybrid  # noqa: E402
from specproof.engine.targets.coreml_eval import SOURCE_ROUTER_MARGIN, SOURCE_RTOL, CoreMLEvalTarget  # noqa: E402
from specproof.engine.targets.coreml_eval import load_spec as load_eval  # noqa: E402
from specproof.engine.targets.reference_spec import load  # noqa: E402

ONLY = "target.chunk-invariance,target.matches-source"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("oracle")


def _export(root: Path, family: str, layout: str, *, top1: bool = False) -> Path:
    path = root / f"{family}-{layout}{'-top1' if top1 else ''}.mlpackage"
    if not path.exists():
        target = family_target(family)
        if top1:  # another model, consistent with itself
            target = ReferenceHybrid(attrs.evolve(target.config, experts_per_token=1), weights=target.weights)
        export_bundle(path, target, k=4, layout=layout, gdn="loop", target_spec=f"family:{family}")
    return path


def _certify(path: Path, oracle: str, report: Path) -> dict[str, str]:
    argv = ["certify", "target", "--target", f"coreml-eval:{path}", "--oracle", oracle, "--profile", "quick"]
    cli.main([*argv, "--only", ONLY, "--report", str(report)])
    doc = json.loads(report.read_text(encoding="utf-8"))
    return {r["id"]: (r["status"], r["exercised"], r["detail"]) for r in doc["results"]}


@pytest.mark.slow
def test_a_self_consistent_bundle_of_another_model_is_rejected(root: Path, tmp_path: Path) -> None:
    results = _certify(_export(root, "qwen3.6-moe", "kv-mlstate", top1=True), "family:qwen3.6-moe", tmp_path / "r")
    assert results["target.chunk-invariance"][0] == "pass"  # it agrees with itself
    status, _, detail = results["target.matches-source"]
    assert status == "fail" and "differ from the source's" in detail


@pytest.mark.slow
@pytest.mark.parametrize(("family", "layout"), [("lfm2-moe", "all-mlstate"), ("qwen3.6-moe", "kv-mlstate")])
def test_correct_exports_match_their_source(root: Path, tmp_path: Path, family: str, layout: str) -> None:
    results = _certify(_export(root, family, layout), f"family:{family}", tmp_path / "r")
    for inv in ONLY.split(","):
        status, exercised, detail = results[inv]
        assert status == "pass" and exercised > 0, (inv, detail)


def test_the_evaluator_target_declares_its_tolerance_against_a_source(root: Path) -> None:
    path = _export(root, "lfm2-moe", "kv-mlstate")
    target = CoreMLEvalTarget(path)
    assert (target.source_rtol, target.source_router_margin) == (SOURCE_RTOL, SOURCE_ROUTER_MARGIN)
    tuned = load_eval(f"{path},source_rtol=0.1,source_router_margin=0")
    assert (tuned.source_rtol, tuned.source_router_margin) == (0.1, 0.0)
    for bad in ("source_rtol=-1", "source_rtol=x", "rtol=1"):
        with pytest.raises(Exception, match="coreml-eval target option"):
            load_eval(f"{path},{bad}")
    assert load("").vocab_size == target.vocab_size  # (the oracle check compares vocabularies first)
