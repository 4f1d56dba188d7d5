"""The multifunction export: fixed-shape ``decode`` (q = 1) and ``verify`` (q = K + 1) functions sharing weights.

Both families' multifunction bundles certify on Linux against their source (``--oracle``), ``bundle
check`` passes them, the evaluator feeds each chunk through the function that fits it, and ``bundle
inspect`` judges each function: only ``verify`` verifies K drafts in one forward; both are fixed-shape
(Neural Engine eligible), where a range-shaped single function is eligible only at its default shape.
A multifunction bundle whose verify function breaks router ties the other way fails certification.
"""

from __future__ import annotations

import json
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
    function_sizes,
    inspect_bundle,
)
from specproof.engine import InvalidSettingError  # noqa: E402
from specproof.engine.targets.coreml_eval import FP16_TIE_TOLERANCE, CoreMLEvalTarget  # noqa: E402
from specproof.formats import validate  # noqa: E402

K = 4
FAMILY_LAYOUT = {"lfm2-moe": "all-mlstate", "qwen3.6-moe": "kv-mlstate"}


@pytest.fixture(autouse=True)
def _bundle_command(monkeypatch: pytest.MonkeyPatch) -> None:
    if "specproof._cli.bundle" not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "specproof._cli.bundle"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multifunction")


def _bundle(root: Path, family: str, *, planted: str = "") -> Path:
    path = root / f"{family}-{planted or 'ok'}.mlpackage"
    if not path.exists():
        export_multifunction(
            path, family_target(family), k=K, layout=FAMILY_LAYOUT[family], target_spec=f"family:{family}",
            _planted=planted or None,
        )  # fmt: skip
    return path


def test_function_sizes() -> None:
    assert function_sizes(3) == {"decode": 1, "verify": 4}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILY_LAYOUT))
def test_inspect_judges_each_function(root: Path, family: str) -> None:
    report = inspect_bundle(_bundle(root, family), k=K)
    assert validate("bundle-inspect-1", report.to_json()) == []
    by_name = {f.name: f for f in report.functions}
    assert set(by_name) == {"decode", "verify"} and by_name["decode"].default
    assert [r.id for r in by_name["decode"].failed] == ["token-input", "logits"]  # one token: no K-draft verify
    assert by_name["verify"].qualifies and report.qualifies
    for fn in by_name.values():
        assert fn.compute_units is not None and fn.compute_units.neural_engine == "all-shapes"
        assert fn.state_layout == FAMILY_LAYOUT[family]
    assert report.metadata["specproof.functions"] == f"decode:1,verify:{K + 1}"


@pytest.mark.slow
def test_a_range_shaped_bundle_runs_on_the_neural_engine_at_its_default_shape_only(root: Path) -> None:
    path = root / "range.mlpackage"
    export_bundle(path, family_target("lfm2-moe"), k=K, layout="kv-mlstate")
    (fn,) = inspect_bundle(path, k=K).functions
    assert fn.compute_units is not None
    assert fn.compute_units.neural_engine == "default-shape-only" and "neural_engine" not in fn.compute_units.units
    assert "724930" in fn.compute_units.detail and "input_ids" in fn.compute_units.detail


@pytest.mark.slow
def test_the_evaluator_feeds_each_chunk_through_the_function_that_fits(root: Path) -> None:
    target = CoreMLEvalTarget(_bundle(root, "qwen3.6-moe"))
    assert target.functions == {"decode": 1, "verify": K + 1} and target.max_query == K + 1
    tokens = list(b"The quick brown fox")
    chunked = [target.forward(tokens[:7]), target.forward(tokens[7:12]), target.forward(tokens[12:])]
    # 7 = verify + 2 decode; 5 = verify; 7 = verify + 2 decode
    assert target.function_calls == {"verify": 3, "decode": 4}
    target.reset()
    one_by_one = [target.forward([t]) for t in tokens]
    import numpy as np

    assert np.array_equal(np.concatenate(chunked), np.concatenate(one_by_one))
    assert "functions=decode:1,verify:5" in target.describe()


def _certify(path: Path, family: str, *extra: str) -> int:
    argv = ["certify", "target", "--target", f"coreml-eval:{path}", "--oracle", f"family:{family}"]
    return cli.main([*argv, "--tie-tolerance", str(FP16_TIE_TOLERANCE), *extra])


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILY_LAYOUT))
def test_certifies_against_its_source_at_quick(
    root: Path, family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    code = _certify(_bundle(root, family), family, "--profile", "quick", "--report", str(report))
    assert code == 0, capsys.readouterr().out[-3000:]
    doc = json.loads(report.read_text(encoding="utf-8"))
    verdicts = {r["id"]: (r["status"], r["exercised"]) for r in doc["results"]}
    for inv in ("target.chunk-invariance", "target.restore", "target.checkpoints", "target.matches-source"):
        assert verdicts[inv][0] == "pass" and verdicts[inv][1] > 0, inv


@pytest.mark.slow
def test_bundle_check_passes_against_its_source(root: Path) -> None:
    report = check_bundle(_bundle(root, "lfm2-moe"), family_target("lfm2-moe"), options=CheckOptions(examples=20))
    assert report.verdict == "pass", [r.to_json() for r in report.results]


@pytest.mark.slow
def test_a_verify_function_with_another_tie_order_fails_certification(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bundle(root, "qwen3.6-moe", planted="router-ties")  # ties broken upward in multi-token forwards
    capsys.readouterr()
    assert _certify(path, "qwen3.6-moe", "--profile", "quick", "--only", "target.chunk-invariance") == 1
    assert "one-token forwards" in capsys.readouterr().out


@pytest.mark.slow
def test_a_multifunction_bundle_without_a_one_token_function_is_refused(root: Path, tmp_path: Path) -> None:
    desc = ct.utils.MultiFunctionDescriptor()
    desc.add_function(str(_bundle(root, "lfm2-moe")), src_function_name="verify", target_function_name="verify")
    desc.default_function_name = "verify"
    path = tmp_path / "verify-only.mlpackage"
    ct.utils.save_multifunction(desc, str(path))
    with pytest.raises(InvalidSettingError, match="no function takes one token"):
        CoreMLEvalTarget(path)


def test_fixed_shapes_take_no_max_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.mlpackage"
    argv = ["bundle", "export", str(out), "--family", "lfm2-moe", "--multifunction", "--max-query", "8"]
    assert cli.main(argv) == 2
    assert "--multifunction writes fixed shapes" in capsys.readouterr().err and not out.exists()
    with pytest.raises(InvalidSettingError, match="k=0"):
        export_multifunction(out, family_target("lfm2-moe"), k=0)
