"""``specproof bundle inspect``: the verify-qualification verdict on exported and hand-made bundles (runs on Linux)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")

from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import get_new_symbol, types  # noqa: E402

from specproof import cli  # noqa: E402
from specproof.coreml import BundleReadError, export_bundle, inspect_bundle  # noqa: E402
from specproof.engine import ReferenceConfig, ReferenceHybrid  # noqa: E402
from specproof.formats import validate  # noqa: E402

EXPORT_CONFIG = ReferenceConfig(layers=("conv", "attn", "conv", "attn"), max_context=512)


@pytest.fixture(autouse=True)
def _bundle_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # the lead registers the module in cli.COMMANDS; make sure it is there for these tests either way
    if "specproof._cli.bundle" not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "specproof._cli.bundle"))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    target = ReferenceHybrid(EXPORT_CONFIG)
    good = export_bundle(root / "ref.mlpackage", target, k=4).path
    last = export_bundle(root / "last.mlpackage", target, k=4, last_token_only=True).path
    return {"good": good, "last": last, "root": root}


def _save(prog: Any, path: Path, inputs: list[Any]) -> Path:
    model = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT32,
        inputs=inputs,
        skip_model_load=True,
    )
    model.save(str(path))
    return path


_EMB = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float16)


def _flex_ids(upper: int = 8) -> Any:
    return ct.TensorType(name="input_ids", shape=(1, ct.RangeDim(1, upper, default=1)), dtype=np.int32)


_POSITION = ct.TensorType(name="position", shape=(1,), dtype=np.int32)


def _stateless(path: Path) -> Path:
    @mb.program(
        input_specs=[mb.TensorSpec((1, get_new_symbol()), dtype=types.int32), mb.TensorSpec((1,), dtype=types.int32)],
        opset_version=ct.target.iOS18,
    )
    def prog(input_ids: Any, position: Any) -> Any:
        h = mb.gather(x=_EMB, indices=input_ids, axis=0)
        return mb.cast(x=mb.linear(x=h, weight=_EMB), dtype="fp32", name="logits")

    return _save(prog, path, [_flex_ids(), _POSITION])


def _stateful(path: Path, *, fixed_one: bool = False, argmax: bool = False) -> Path:
    seq = 1 if fixed_one else get_new_symbol()

    @mb.program(
        input_specs=[
            mb.TensorSpec((1, seq), dtype=types.int32),
            mb.TensorSpec((1,), dtype=types.int32),
            mb.StateTensorSpec((1, 1, 32, 8), dtype=types.fp16),
            mb.StateTensorSpec((1, 8, 2), dtype=types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def prog(input_ids: Any, position: Any, key_cache: Any, conv_state: Any) -> Any:
        h = mb.gather(x=_EMB, indices=input_ids, axis=0)  # [1, q, 8]
        kc = mb.read_state(input=key_cache)
        cs = mb.read_state(input=conv_state)
        mb.coreml_update_state(state=key_cache, value=mb.mul(x=kc, y=np.float16(0.5)))
        mb.coreml_update_state(state=conv_state, value=mb.mul(x=cs, y=np.float16(0.5)))
        bias = mb.reduce_sum(x=mb.reduce_sum(x=cs, axes=[2], keep_dims=False), axes=[0], keep_dims=False)  # [8]
        logits = mb.linear(x=mb.add(x=h, y=bias), weight=_EMB)  # [1, q, 16]
        if argmax:
            return mb.reduce_argmax(x=logits, axis=-1, keep_dims=False, name="next_token")
        return mb.cast(x=logits, dtype="fp32", name="logits")

    ids = ct.TensorType(name="input_ids", shape=(1, 1), dtype=np.int32) if fixed_one else _flex_ids()
    return _save(prog, path, [ids, _POSITION])


def _failed(report: Any) -> set[str]:
    (fn,) = report.functions
    return {r.id for r in fn.failed}


def test_exported_bundle_qualifies_for_k4(bundles: dict[str, Path]) -> None:
    report = inspect_bundle(bundles["good"], k=4)
    assert report.qualifies and report.exit_code == 0
    (fn,) = report.functions
    rule_ids = [r.id for r in fn.rules]
    assert rule_ids == [
        "ml-program",
        "token-input",
        "logits",
        "kv-state",
        "recurrent-state",
        "states-threaded",
        "position",
        "declared-types",
    ]
    assert {s.name: s.dims for s in fn.states} == {
        "key_cache": (2, 2, 512, 16),
        "value_cache": (2, 2, 512, 16),
        "conv_state": (2, 64, 2),
    }
    assert all(s.dtype == "FLOAT16" for s in fn.states)
    (ids,) = [t for t in fn.inputs if t.name == "input_ids"]
    assert ids.shape_kind == "range" and ids.dims == (1, "1..64")
    (logits,) = fn.outputs
    assert logits.dims == (1, "?", 256) and logits.shape_kind == "symbolic"
    assert report.deployment_target == "iOS 18 / macOS 15" and report.specification_version == 9


def test_k_beyond_the_token_range_does_not_qualify(bundles: dict[str, Path]) -> None:
    report = inspect_bundle(bundles["good"], k=64)  # the range is 1..64; K+1 = 65
    assert _failed(report) == {"token-input"}
    (rule,) = report.functions[0].failed
    assert "65" in rule.detail and rule.why


def test_last_token_only_is_rejected(bundles: dict[str, Path]) -> None:
    report = inspect_bundle(bundles["last"], k=4)
    assert not report.qualifies and report.exit_code == 1
    assert _failed(report) == {"logits"}
    (rule,) = report.functions[0].failed
    assert "last-token-only" in rule.detail and "one logit row per input position" in rule.why


def test_stateless_bundle_is_rejected(tmp_path: Path) -> None:
    report = inspect_bundle(_stateless(tmp_path / "stateless.mlpackage"), k=4)
    assert _failed(report) == {"kv-state", "recurrent-state"}


def test_fixed_length_one_input_is_rejected(tmp_path: Path) -> None:
    report = inspect_bundle(_stateful(tmp_path / "fixed1.mlpackage", fixed_one=True), k=4)
    assert "token-input" in _failed(report)
    (rule,) = [r for r in report.functions[0].rules if r.id == "token-input"]
    assert "fixed length 1" in rule.detail


def test_in_graph_argmax_is_rejected(tmp_path: Path) -> None:
    report = inspect_bundle(_stateful(tmp_path / "argmax.mlpackage", argmax=True), k=4)
    assert _failed(report) == {"logits"}
    (rule,) = report.functions[0].failed
    assert "reduce_argmax" in rule.detail


def test_stateful_handmade_bundle_with_logits_qualifies(tmp_path: Path) -> None:
    # the control for the three rejections above: same builder, nothing broken
    assert inspect_bundle(_stateful(tmp_path / "ok.mlpackage"), k=4).qualifies


def test_multifunction_bundle_gets_a_verdict_per_function(bundles: dict[str, Path], tmp_path: Path) -> None:
    desc = ct.utils.MultiFunctionDescriptor()
    desc.add_function(str(bundles["good"]), src_function_name="main", target_function_name="verify")
    desc.add_function(str(bundles["last"]), src_function_name="main", target_function_name="decode")
    desc.default_function_name = "decode"
    path = tmp_path / "multi.mlpackage"
    ct.utils.save_multifunction(desc, str(path))
    report = inspect_bundle(path, k=4)
    verdicts = {f.name: f.qualifies for f in report.functions}
    assert verdicts == {"verify": True, "decode": False}
    assert [f.name for f in report.functions if f.default] == ["decode"]
    assert report.qualifies  # one function can verify


def test_cli_exit_codes_and_json(bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bundle", "inspect", str(bundles["good"]), "--k", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert validate("bundle-inspect-1", doc) == []  # its JSON Schema (specproof/schemas/)
    assert doc["format"] == "specproof-bundle-inspect/1" and doc["qualifies"] is True
    assert doc["qualifying_functions"] == ["main"]
    assert cli.main(["bundle", "inspect", str(bundles["last"]), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert validate("bundle-inspect-1", doc) == []
    broken = {**doc, "qualifies": "yes"}
    assert validate("bundle-inspect-1", broken)  # the schema can fail
    failed = [r for r in doc["functions"][0]["rules"] if not r["passed"]]
    assert [r["id"] for r in failed] == ["logits"] and failed[0]["why"]


def test_cli_text_output_is_a_table(bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bundle", "inspect", str(bundles["last"])]) == 1
    out = capsys.readouterr().out
    for needle in ("key_cache", "conv_state", "input_ids", "1..64", "FAIL", "last-token-only", "DOES NOT QUALIFY"):
        assert needle in out


@pytest.mark.parametrize("kind", ["missing", "plain-dir", "corrupt", "not-a-model"])
def test_unreadable_bundles_exit_2(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if kind == "missing":
        path, needle = tmp_path / "nope.mlpackage", "no such file"
    elif kind == "plain-dir":
        path, needle = tmp_path / "folder", "not an .mlpackage"
        path.mkdir()
        (path / "weights.bin").write_bytes(b"\0" * 8)
    elif kind == "corrupt":
        path, needle = tmp_path / "bad.mlpackage", "corrupt"
        data = path / "Data" / "com.apple.CoreML"
        data.mkdir(parents=True)
        (data / "model.mlmodel").write_bytes(b"this is not a protobuf \xff\xfe" * 4)
        (path / "Manifest.json").write_text("{not json", encoding="utf-8")
    else:
        path, needle = tmp_path / "notes.txt", "not a Core ML model"
        path.write_text("hello", encoding="utf-8")
    with pytest.raises(BundleReadError, match=needle):
        inspect_bundle(path)
    assert cli.main(["bundle", "inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a readable bundle" in err and needle in err


def test_bad_k_is_a_usage_error(bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bundle", "inspect", str(bundles["good"]), "--k", "0"]) == 2
    assert "k=0" in capsys.readouterr().err


def test_inspect_prints_no_coremltools_import_noise(bundles: dict[str, Path]) -> None:
    """A fresh process: coremltools' import-time warnings (8 lines on Linux) are not shown."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "specproof.cli", "bundle", "inspect", str(bundles["good"]), "--k", "4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Failed to load" not in proc.stderr and "Failed to load" not in proc.stdout


def test_inspect_json_errors_are_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bundle", "inspect", str(tmp_path / "missing.mlpackage"), "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["exit_code"] == 2 and "no such file" in data["error"]
    assert validate("bundle-inspect-1", data) == []


def _io_state(path: Path, *, out_shape: tuple[int, ...] = (1, 8, 2), passthrough: bool = False) -> Path:
    """A hand-made kv-mlstate bundle whose recurrent state is an ``in_conv`` -> ``out_conv`` pair."""

    @mb.program(
        input_specs=[
            mb.TensorSpec((1, get_new_symbol()), dtype=types.int32),
            mb.TensorSpec((1,), dtype=types.int32),
            mb.TensorSpec((1, 8, 2), dtype=types.fp16),
            mb.StateTensorSpec((1, 1, 32, 8), dtype=types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def prog(input_ids: Any, position: Any, in_conv: Any, past_keys: Any) -> Any:
        h = mb.gather(x=_EMB, indices=input_ids, axis=0)
        kc = mb.read_state(input=past_keys)
        mb.coreml_update_state(state=past_keys, value=mb.mul(x=kc, y=np.float16(0.5)))
        bias = mb.reduce_sum(x=mb.reduce_sum(x=in_conv, axes=[2], keep_dims=False), axes=[0], keep_dims=False)
        logits = mb.cast(x=mb.linear(x=mb.add(x=h, y=bias), weight=_EMB), dtype="fp32", name="logits")
        new = mb.identity(x=in_conv) if passthrough else mb.mul(x=in_conv, y=np.float16(0.5))
        if out_shape != (1, 8, 2):
            new = mb.reshape(x=new, shape=list(out_shape))
        return logits, mb.identity(x=new, name="out_conv")

    conv = ct.TensorType(name="in_conv", shape=(1, 8, 2), dtype=np.float16)
    return _save(prog, path, [_flex_ids(), _POSITION, conv])


def test_states_threaded_accepts_another_io_naming_and_rejects_bad_pairs(tmp_path: Path) -> None:
    # correct but different from the exporter's: past_keys as MLState, in_conv -> out_conv as tensors
    report = inspect_bundle(_io_state(tmp_path / "io.mlpackage"), k=4)
    (fn,) = report.functions
    assert report.qualifies and fn.state_layout == "kv-mlstate" and fn.warnings == ()
    assert "in_conv -> out_conv" in next(r.detail for r in fn.rules if r.id == "states-threaded")
    report = inspect_bundle(_io_state(tmp_path / "shape.mlpackage", out_shape=(1, 16)), k=4)
    assert _failed(report) == {"states-threaded"}
    assert "cannot be fed back as 'in_conv'" in report.functions[0].failed[0].detail
    report = inspect_bundle(_io_state(tmp_path / "same.mlpackage", passthrough=True), k=4)
    assert _failed(report) == {"states-threaded"}
    assert "passed through unchanged" in report.functions[0].failed[0].detail


def test_a_recurrent_mlstate_earns_the_neural_engine_warning(tmp_path: Path) -> None:
    (fn,) = inspect_bundle(_stateful(tmp_path / "two.mlpackage"), k=4).functions
    assert fn.qualifies and fn.state_layout == "all-mlstate"
    (warning,) = fn.warnings
    assert "1 non-KV state held as MLState (conv_state)" in warning and "LFM2_CONVERSION_FINDINGS.md" in warning
