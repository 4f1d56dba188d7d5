"""Inspect catches what the evaluator can: a no-op state write, and declared types that disagree with the program.

Each broken bundle is a correct export with its saved spec edited (``Data/com.apple.CoreML/model.mlmodel``):
one write, one declared dtype or shape. Each fails a named rule with a message naming the tensor;
``certify`` on a bundle coremltools cannot load is a usage error (exit 2) naming the problem, never
coremltools' traceback.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ct = pytest.importorskip("coremltools")

from specproof import cli  # noqa: E402
from specproof.coreml import export_bundle, family_target, inspect_bundle  # noqa: E402

CONV = [2, 32, 2]  # lfm2-moe's conv_state: 2 conv layers, 32 channels, kernel 3 - 1


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("declared")
    out = {}
    for layout in ("all-mlstate", "kv-mlstate"):
        out[layout] = root / f"{layout}.mlpackage"
        export_bundle(out[layout], family_target("lfm2-moe"), k=4, layout=layout, gdn="loop")
    return out


def _edited(src: Path, dst: Path, edit: Callable[[Any, Any, Any], None]) -> Path:
    shutil.copytree(src, dst)
    model = dst / "Data" / "com.apple.CoreML" / "model.mlmodel"
    spec = ct.proto.Model_pb2.Model()
    spec.ParseFromString(model.read_bytes())
    func = spec.mlProgram.functions["main"]
    edit(spec, func, func.block_specializations[func.opset])
    model.write_bytes(spec.SerializeToString())
    return dst


def _set_dims(tensor_type: Any, dims: list[int]) -> None:
    for d, size in zip(tensor_type.dimensions, dims, strict=True):
        d.constant.size = size


def _failed(path: Path) -> dict[str, str]:
    (fn,) = inspect_bundle(path, k=4).functions
    return {r.id: r.detail for r in fn.failed}


def _noop_write(spec: Any, func: Any, block: Any) -> None:
    read = next(o.name for op in block.operations if op.type == "read_state"
                and op.inputs["input"].arguments[0].name == "conv_state" for o in op.outputs)  # fmt: skip
    write = next(op for op in block.operations if op.type == "write_state"
                 and op.inputs["input"].arguments[0].name == "conv_state")  # fmt: skip
    write.inputs["data"].arguments[0].name = read


def _state_declared_wider(spec: Any, func: Any, block: Any) -> None:
    state = next(s for s in spec.description.state if s.name == "conv_state")
    state.type.stateType.arrayType.shape[2] = 3


def _state_typed_wider(spec: Any, func: Any, block: Any) -> None:
    _state_declared_wider(spec, func, block)
    var = next(v for v in func.inputs if v.name == "conv_state")
    _set_dims(var.type.stateType.wrappedType.tensorType, [2, 32, 3])


def _position_declared_float(spec: Any, func: Any, block: Any) -> None:
    feature = next(f for f in spec.description.input if f.name == "position")
    feature.type.multiArrayType.dataType = ct.proto.FeatureTypes_pb2.ArrayFeatureType.FLOAT32


def _output_declared_wider(spec: Any, func: Any, block: Any) -> None:
    feature = next(f for f in spec.description.output if f.name == "conv_state_out")
    del feature.type.multiArrayType.shape[:]
    feature.type.multiArrayType.shape.extend([2, 32, 3])


def _output_typed_wider(spec: Any, func: Any, block: Any) -> None:
    _output_declared_wider(spec, func, block)
    op = next(op for op in block.operations for o in op.outputs if o.name == "conv_state_out")
    _set_dims(next(o for o in op.outputs if o.name == "conv_state_out").type.tensorType, [2, 32, 3])


@pytest.mark.slow
def test_correct_exports_pass_both_rules(exported: dict[str, Path]) -> None:
    for path in exported.values():
        (fn,) = inspect_bundle(path, k=4).functions
        rules = {r.id: r for r in fn.rules}
        assert rules["declared-types"].passed and rules["states-threaded"].passed and fn.qualifies


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layout", "edit", "rule", "needle"),
    [
        ("all-mlstate", _noop_write, "states-threaded",
         "state 'conv_state' is written back with the value read from it (a no-op write)"),
        ("all-mlstate", _state_declared_wider, "declared-types",
         "state 'conv_state' is declared [2, 32, 3], the program's is [2, 32, 2]"),
        ("all-mlstate", _state_typed_wider, "states-threaded",
         "state 'conv_state' [2, 32, 3] is written with a value of shape [2, 32, 2]"),
        ("kv-mlstate", _position_declared_float, "declared-types",
         "input 'position' is declared FLOAT32, the program's is INT32"),
        ("kv-mlstate", _output_declared_wider, "declared-types",
         "output 'conv_state_out' is declared [2, 32, 3], the program's is [2, 32, 2]"),
    ],
)  # fmt: skip
def test_each_disagreement_fails_a_named_rule(
    exported: dict[str, Path], tmp_path: Path, layout: str, edit: Any, rule: str, needle: str
) -> None:
    path = _edited(exported[layout], tmp_path / "edited.mlpackage", edit)
    failed = _failed(path)
    assert list(failed) == [rule], failed
    assert needle in failed[rule]


@pytest.mark.slow
@pytest.mark.parametrize("edit", [_state_typed_wider, _output_typed_wider])
def test_certify_says_what_is_wrong_without_a_traceback(
    exported: dict[str, Path], tmp_path: Path, edit: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = "all-mlstate" if edit is _state_typed_wider else "kv-mlstate"
    path = _edited(exported[layout], tmp_path / "typed.mlpackage", edit)
    capsys.readouterr()
    argv = ["certify", "target", "--target", f"coreml-eval:{path}", "--profile", "quick", "--only", "target.shape"]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert "coremltools cannot load its ML program" in captured.err and "bundle inspect" in captured.err
    assert "Traceback" not in captured.err + captured.out
    failed = _failed(path)
    assert failed, "inspect must name the disagreement certify refers to"
