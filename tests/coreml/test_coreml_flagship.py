"""The flagship bundles (runs on Linux): Gated DeltaNet and mixture-of-experts exports in both state layouts.

Each bundle is evaluated op by op (``specproof.coreml.MilEvaluator``) and compared with
its reference target at every position within ``LOGIT_TOL`` (fp16 against float32);
``certify target --target coreml-eval:...`` passes on correct bundles and fails, on a
named invariant, on bundles exported with a planted (test-only) bug.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")

from specproof import cli  # noqa: E402
from specproof.coreml import (  # noqa: E402
    EVALUATOR_OPS,
    GOLDEN_PROMPTS,
    MilEvaluator,
    UnknownOpError,
    export_bundle,
    family_target,
    golden_cases,
    inspect_bundle,
)
from specproof.engine import InvalidSettingError, PluginError, ReferenceConfig, ReferenceHybrid  # noqa: E402
from specproof.engine.targets.coreml_eval import (  # noqa: E402
    FP16_TIE_TOLERANCE,
    SOURCE_ROUTER_MARGIN,
    CoreMLEvalTarget,
    load_spec,
)
from specproof.formats import validate  # noqa: E402
from specproof.plugins import load_target  # noqa: E402

LOGIT_TOL = 0.03  # relative to the chunk's largest |logit|: fp16 recurrences through 4 blocks (measured <= 1.5%)
SHAPES = ("lfm2-moe", "qwen3.6-moe")
LAYOUTS = ("all-mlstate", "kv-mlstate")
TOKENS = list(GOLDEN_PROMPTS[0]) + list(GOLDEN_PROMPTS[1])
CHUNKS = (5, 1, 3, 16, 1, 7, 2, 30)  # 30 > max_query (16 for unrolled gdn): the target splits it


@pytest.fixture(autouse=True)
def _bundle_command(monkeypatch: pytest.MonkeyPatch) -> None:
    if "specproof._cli.bundle" not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "specproof._cli.bundle"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flagship")


_CACHE: dict[tuple[str, str, str, str], Path] = {}


def _bundle(root: Path, family: str, layout: str, *, gdn: str = "unrolled", planted: str = "") -> Path:
    key = (family, layout, gdn, planted)
    if key not in _CACHE:
        path = root / f"{family}-{layout}-{gdn}-{planted or 'ok'}.mlpackage"
        export_bundle(path, family_target(family), k=4, layout=layout, gdn=gdn, _planted=planted or None)
        _CACHE[key] = path
    return _CACHE[key]


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    tol = LOGIT_TOL * float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert err <= tol, f"{what}: max |logit error| {err:.4f} > {tol:.4f}"


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", SHAPES)
def test_every_position_matches_the_reference(root: Path, family: str, layout: str) -> None:
    target = load_target(f"coreml-eval:{_bundle(root, family, layout)}")
    assert isinstance(target, CoreMLEvalTarget) and target.layout == layout
    ref = family_target(family)
    pos = 0
    for size in CHUNKS:
        chunk = TOKENS[pos : pos + size]
        _close(target.forward(chunk), ref.forward(chunk), f"{family}/{layout} chunk at {pos}")
        pos += len(chunk)
    got, want = target.state_arrays(), ref.state_arrays()
    assert set(got) == {k for k, v in want.items() if v.size}  # lfm2-moe has no rec_state (no gdn block)
    for name, value in want.items():
        if value.size:
            err = float(np.abs(got[name] - value).max())
            assert err <= LOGIT_TOL * float(np.abs(value).max()), f"{name}: {err}"


@pytest.mark.slow
def test_gdn_loop_and_unrolled_agree_and_match(root: Path) -> None:
    unrolled = CoreMLEvalTarget(_bundle(root, "qwen3.6-moe", "kv-mlstate"))
    loop = CoreMLEvalTarget(_bundle(root, "qwen3.6-moe", "kv-mlstate", gdn="loop"))
    assert "while_loop" in loop._ev.op_types and "while_loop" not in unrolled._ev.op_types
    ref = family_target("qwen3.6-moe")
    for chunk in (TOKENS[:9], TOKENS[9:10], TOKENS[10:15]):
        a, b = unrolled.forward(chunk), loop.forward(chunk)
        np.testing.assert_array_equal(a, b)  # the same ops per step, in the same order
        _close(b, ref.forward(chunk), "loop")


@pytest.mark.slow
def test_router_ties_go_to_the_lower_expert(root: Path) -> None:
    """Experts 0 and 1 share their router row: every token ties them. The bundle must pick as the reference."""
    ref = family_target("lfm2-moe")
    ref.forward(TOKENS[:20])
    routing = ref.last_routing[0]
    assert ((routing == 0).any(axis=1) & ~(routing == 1).any(axis=1)).any(), "no tie decided at the top-k boundary"
    # a target that breaks the ties upward (the same weights, experts 0 and 1 swapped in every MoE layer but
    # their router rows) is a different function: the bundle must match the reference, not it
    w = ref.weights
    for i in range(4):
        p = f"model.layers.{i}.feed_forward.experts."
        for name in ("w1", "w2", "w3"):
            w[f"{p}0.{name}.weight"], w[f"{p}1.{name}.weight"] = w[f"{p}1.{name}.weight"], w[f"{p}0.{name}.weight"]
    upward = ReferenceHybrid(ref.config, weights=w)
    ev = CoreMLEvalTarget(_bundle(root, "lfm2-moe", "all-mlstate"))
    fresh = family_target("lfm2-moe")
    got, want, other = ev.forward(TOKENS[:20]), fresh.forward(TOKENS[:20]), upward.forward(TOKENS[:20])
    _close(got, want, "ties")
    assert np.abs(got - other).max() > LOGIT_TOL * np.abs(other).max()  # the check can tell the two apart


@pytest.mark.slow
@pytest.mark.parametrize("family", SHAPES)
def test_greedy_tokens_match_the_golden_cases(root: Path, family: str) -> None:
    target = CoreMLEvalTarget(_bundle(root, family, "kv-mlstate"))
    from specproof.engine import greedy_decode

    for case in golden_cases(family_target(family), prompts=GOLDEN_PROMPTS[:3], max_new_tokens=12):
        target.reset()
        got = list(greedy_decode(target, case["prompt"], case["max_new_tokens"], eos_token_id=None).tokens)
        if got == case["tokens"]:
            continue
        # fp16 may order two nearly tied router scores the other way (bundle.greedy's rule, docs/coreml.md):
        # a divergence is allowed only after a source router margin under the declared one
        i = next(j for j, (a, b) in enumerate(zip(got, case["tokens"], strict=True)) if a != b)
        source = family_target(family)
        source.forward([*case["prompt"], *case["tokens"][:i]])
        margin = float(np.min(np.stack(source.last_router_margins)))
        assert margin < SOURCE_ROUTER_MARGIN, (case["prompt"], i, margin)


def _certify(path: Path, *extra: str) -> int:
    argv = ["certify", "target", "--target", f"coreml-eval:{path}", "--profile", "quick"]
    return cli.main([*argv, "--tie-tolerance", str(FP16_TIE_TOLERANCE), *extra])


@pytest.mark.slow
@pytest.mark.parametrize(("family", "layout"), [("qwen3.6-moe", "kv-mlstate"), ("lfm2-moe", "all-mlstate")])
def test_certify_passes_on_correct_bundles(
    root: Path, family: str, layout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    assert _certify(_bundle(root, family, layout), "--report", str(report)) == 0, capsys.readouterr().out[-3000:]
    doc = json.loads(report.read_text(encoding="utf-8"))
    verdicts = {r["id"]: r["status"] for r in doc["results"]}
    for inv in ("target.chunk-invariance", "target.restore", "target.checkpoints", "target.causality"):
        assert verdicts[inv] == "pass", inv


@pytest.mark.slow
@pytest.mark.parametrize(
    ("planted", "layout"),
    [("state-not-written", "all-mlstate"), ("state-not-written", "kv-mlstate"), ("gdn-last-token", "kv-mlstate"),
     ("router-ties", "all-mlstate")],
)  # fmt: skip
def test_certify_rejects_planted_export_bugs(
    root: Path, planted: str, layout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bundle(root, "qwen3.6-moe", layout, planted=planted)
    capsys.readouterr()
    assert _certify(path, "--only", "target.chunk-invariance") == 1
    out = capsys.readouterr().out
    assert "target.chunk-invariance" in out and "one-token forwards" in out


@pytest.mark.slow
def test_inspect_names_the_layout_and_flags_recurrent_mlstate(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for family in SHAPES:
        for layout in LAYOUTS:
            path = _bundle(root, family, layout)
            report = inspect_bundle(path, k=4)
            (fn,) = report.functions
            assert report.qualifies and fn.state_layout == layout
            assert validate("bundle-inspect-1", report.to_json()) == []
            if layout == "all-mlstate":
                (warning,) = fn.warnings
                assert "conv_state" in warning and "0x1d" in warning and "Error=11" in warning
            else:
                assert fn.warnings == ()
                assert {t.name for t in fn.states} == {"key_cache", "value_cache"}
                threaded = next(r for r in fn.rules if r.id == "states-threaded")
                assert "conv_state -> conv_state_out" in threaded.detail
    assert cli.main(["bundle", "inspect", str(_bundle(root, "qwen3.6-moe", "all-mlstate"))]) == 0
    out = capsys.readouterr().out
    assert "state layout: all-mlstate" in out and "ANEProgramProcessRequestDirect" in out


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_inspect_rejects_a_state_not_written_back(root: Path, layout: str) -> None:
    report = inspect_bundle(_bundle(root, "qwen3.6-moe", layout, planted="state-not-written"), k=4)
    (fn,) = report.functions
    assert not report.qualifies and [r.id for r in fn.failed] == ["states-threaded"]
    needle = "'rec_state' is read but never written back" if layout == "all-mlstate" else "passed through unchanged"
    assert needle in fn.failed[0].detail


@pytest.mark.slow
def test_snapshot_restore_and_checkpoints_copy_the_states(root: Path) -> None:
    t = CoreMLEvalTarget(_bundle(root, "qwen3.6-moe", "kv-mlstate"))
    t.forward(TOKENS[:6])
    snap = t.snapshot()
    first = t.forward(TOKENS[6:9])
    t.restore(snap)
    np.testing.assert_array_equal(t.forward(TOKENS[6:9]), first)
    t.restore(snap)
    logits, cps = t.forward_with_checkpoints(TOKENS[6:9])
    np.testing.assert_array_equal(logits, first)
    assert [c.processed for c in cps] == [7, 8, 9] and t.processed == 9  # type: ignore[attr-defined]
    t.restore(cps[0])
    np.testing.assert_array_equal(t.forward(TOKENS[7:9]), first[1:])
    other = CoreMLEvalTarget(_bundle(root, "qwen3.6-moe", "kv-mlstate"))
    with pytest.raises(Exception, match="taken from this target"):
        other.restore(snap)


def test_the_evaluator_names_its_ops() -> None:
    for op in ("linear", "conv", "matmul", "softmax", "slice_update", "softplus", "sigmoid", "select"):
        assert op in EVALUATOR_OPS


def test_an_unimplemented_op_is_an_error_naming_op_and_program(tmp_path: Path) -> None:
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec((1, 4), dtype=types.fp32)], opset_version=ct.target.iOS18)
    def prog(x):  # type: ignore[no-untyped-def]
        return mb.erf(x=x, name="y")

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18, skip_model_load=True)
    path = tmp_path / "erf.mlpackage"
    model.save(str(path))
    with pytest.raises(UnknownOpError, match=r"erf\.mlpackage.*op type 'erf' is not implemented"):
        MilEvaluator(path)
    with pytest.raises(PluginError, match=r"--target 'coreml-eval:.*erf\.mlpackage'.*op type 'erf' is not implemented"):
        load_target(f"coreml-eval:{path}")


def test_bad_specs_and_options_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match="does not exist"):
        load_target(f"coreml-eval:{tmp_path / 'nope.mlpackage'}")
    with pytest.raises(InvalidSettingError, match=r"threads=2.*one of tie_tolerance=X, source_rtol=X"):
        load_spec("x.mlpackage,threads=2")
    with pytest.raises(InvalidSettingError, match="needs the path"):
        load_spec("")
    (tmp_path / "dir.mlpackage").mkdir()
    with pytest.raises(InvalidSettingError, match=r"no Manifest\.json"):
        CoreMLEvalTarget(tmp_path / "dir.mlpackage")
    ref = ReferenceHybrid(ReferenceConfig(layers=("gdn", "attn"), max_context=32))
    for kwargs, needle in (
        ({"layout": "ane"}, "layout='ane'; one of all-mlstate, kv-mlstate"),
        ({"gdn": "scan"}, "gdn='scan'; one of unrolled, loop"),
        ({"_planted": "typo"}, "planted='typo'"),
    ):
        with pytest.raises(InvalidSettingError, match=needle):
            export_bundle(tmp_path / "x.mlpackage", ref, k=4, **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "x.mlpackage").exists()


def test_cli_family_export_refuses_a_target_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bundle", "export", str(tmp_path / "f.mlpackage"), "--family", "lfm2-moe", "--target", "reference"]
    assert cli.main(argv) == 2
    assert "--family and --target are exclusive" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # argparse's own usage error
        cli.main(["bundle", "export", str(tmp_path / "f.mlpackage"), "--family", "mamba"])
    assert info.value.code == 2
    assert "invalid choice: 'mamba'" in capsys.readouterr().err
    assert not (tmp_path / "f.mlpackage").exists()
