"""The ``unified-kv`` layout: keys and values in one Core ML state ``kv_cache`` ``[2, ...]``, the rest as tensors.

Inspect names the layout; the evaluator target reads the one state as ``key_cache`` and
``value_cache``, so ``bundle check`` compares it with the source's caches; both families pass
``bundle check`` and, as a multifunction package, ``certify target --oracle`` at quick.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ct = pytest.importorskip("coremltools")

from specproof import cli  # noqa: E402
from specproof.coreml import (  # noqa: E402
    CheckOptions,
    check_bundle,
    export_bundle,
    export_multifunction,
    family_target,
    inspect_bundle,
)
from specproof.engine.targets.coreml_eval import FP16_TIE_TOLERANCE, CoreMLEvalTarget  # noqa: E402

FAMILIES = ("lfm2-moe", "qwen3.6-moe")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("unified")


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_inspect_names_it_and_bundle_check_compares_both_caches(root: Path, family: str) -> None:
    path = root / f"{family}.mlpackage"
    export_bundle(path, family_target(family), k=4, layout="unified-kv", gdn="loop", target_spec=f"family:{family}")
    report = inspect_bundle(path, k=4)
    (fn,) = report.functions
    assert report.qualifies and fn.state_layout == "unified-kv" and fn.warnings == ()
    assert [t.name for t in fn.states] == ["kv_cache"] and list(fn.states[0].dims)[:1] == [2]
    target = CoreMLEvalTarget(path)
    assert target.layout == "unified-kv" and target.max_context == 128
    result = check_bundle(path, family_target(family), options=CheckOptions(examples=20))
    assert result.verdict == "pass", [r.to_json() for r in result.results]
    states = next(r for r in result.results if r.id == "bundle.states")
    assert "key_cache" in states.detail and "value_cache" in states.detail


@pytest.mark.slow
def test_a_multifunction_unified_kv_bundle_certifies_against_its_source(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = root / "qwen-mf.mlpackage"
    export_multifunction(path, family_target("qwen3.6-moe"), k=4, layout="unified-kv", target_spec="family:qwen3.6-moe")
    argv = ["certify", "target", "--target", f"coreml-eval:{path}", "--oracle", "family:qwen3.6-moe"]
    argv += ["--tie-tolerance", str(FP16_TIE_TOLERANCE), "--profile", "quick"]
    assert cli.main(argv) == 0, capsys.readouterr().out[-3000:]
