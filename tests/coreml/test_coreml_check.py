"""``bundle check --against``: a bundle (run by the evaluator) against the model it was exported from.

Correct exports of both families in both layouts pass; bundles exported with one block changed
(a router top-1 instead of top-2, the delta rule's subtraction swapped, the conv window reversed,
the causal mask inverted) fail, each on a named rule. The broken bundles agree with themselves:
only a comparison with the source sees them.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

ct = pytest.importorskip("coremltools")

from specproof import cli  # noqa: E402
from specproof.coreml import CheckOptions, _blocks, _program, check_bundle, export_bundle, family_target  # noqa: E402
from specproof.engine import InvalidSettingError, PluginError, ReferenceHybrid  # noqa: E402
from specproof.engine.targets._reference_blocks import router_margins  # noqa: E402
from specproof.formats import validate  # noqa: E402
from specproof.plugins import load_target  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src" / "specproof"
QUICK = CheckOptions(examples=20)


@pytest.fixture(autouse=True)
def _bundle_command(monkeypatch: pytest.MonkeyPatch) -> None:
    if "specproof._cli.bundle" not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "specproof._cli.bundle"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("check")


_CACHE: dict[tuple[str, str, str], Path] = {}


def _export(root: Path, family: str, layout: str, gdn: str = "unrolled") -> Path:
    key = (family, layout, gdn)
    if key not in _CACHE:
        path = root / f"{family}-{layout}-{gdn}.mlpackage"
        export_bundle(path, family_target(family), k=4, layout=layout, gdn=gdn, target_spec=f"family:{family}")
        _CACHE[key] = path
    return _CACHE[key]


# --------------------------------------------------------------------------- correct bundles pass


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["all-mlstate", "kv-mlstate"])
@pytest.mark.parametrize("family", ["lfm2-moe", "qwen3.6-moe"])
def test_every_export_passes_against_its_source(root: Path, family: str, layout: str) -> None:
    report = check_bundle(_export(root, family, layout), family_target(family), against=family)
    assert report.verdict == "pass", [r.to_json() for r in report.results]
    assert all(r.exercised > 0 for r in report.results)
    states = next(r for r in report.results if r.id == "bundle.states")
    assert "key_cache" in states.detail and "conv_state" in states.detail
    assert ("rec_state" in states.detail) == (family == "qwen3.6-moe")


@pytest.mark.slow
def test_the_gdn_loop_form_passes_too(root: Path) -> None:
    report = check_bundle(_export(root, "qwen3.6-moe", "kv-mlstate", "loop"), family_target("qwen3.6-moe"))
    assert report.verdict == "pass", [r.to_json() for r in report.results]


# --------------------------------------------------------------------------- broken bundles fail


def _broken(root: Path, name: str, family: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Export ``family`` with one block changed (``name``): a bundle that is a self-consistent other model."""
    target = family_target(family)
    if name == "router-top1":  # the router keeps one expert where the source keeps two
        target = ReferenceHybrid(attrs.evolve(target.config, experts_per_token=1), weights=target.weights)
    elif name == "delta-rule-swapped":  # S^T k - v where the rule subtracts S^T k from v
        real_sub = _blocks._delta_step

        def swapped(g: Any, state: Any, k: Any, q: Any, v: Any, beta: Any, decay: Any) -> tuple[Any, Any]:
            mb = g.mb
            state = mb.mul(x=state, y=decay)
            delta = mb.mul(x=mb.sub(x=mb.matmul(x=k, y=state), y=v), y=beta)
            state = mb.add(x=state, y=mb.matmul(x=k, y=delta, transpose_x=True))
            return state, mb.matmul(x=q, y=state)

        assert real_sub.__code__.co_argcount == swapped.__code__.co_argcount
        monkeypatch.setattr(_blocks, "_delta_step", swapped)
    elif name == "conv-reversed":  # the taps applied newest-first
        real_conv = _blocks._short_conv

        def reversed_window(g: Any, xin: Any, weight: np.ndarray, slot: int, channels: int) -> Any:
            return real_conv(g, xin, np.ascontiguousarray(weight[..., ::-1]), slot, channels)

        monkeypatch.setattr(_blocks, "_short_conv", reversed_window)
    elif name == "mask-inverted":  # key j visible to row i iff j > position + i
        real_prologue = _program._prologue

        def inverted(g: Any, *args: Any) -> None:  # the prologue's inputs as the program's layout gives them
            real_prologue(g, *args)
            g.mask = g.mb.logical_not(x=g.mask)

        monkeypatch.setattr(_program, "_prologue", inverted)
    path = root / f"broken-{name}-{family}.mlpackage"
    export_bundle(path, target, k=4, layout="kv-mlstate", gdn="loop", target_spec=f"family:{family}")
    monkeypatch.undo()
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "family"),
    [("router-top1", "qwen3.6-moe"), ("delta-rule-swapped", "qwen3.6-moe"), ("conv-reversed", "lfm2-moe"),
     ("mask-inverted", "lfm2-moe")],
)  # fmt: skip
def test_a_bundle_of_another_model_fails(root: Path, name: str, family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _broken(root, name, family, monkeypatch)
    report = check_bundle(path, family_target(family), against=family, options=QUICK)
    assert report.verdict == "fail" and report.exit_code == 1
    failed = {r.id: r.detail for r in report.results if r.status == "fail"}
    assert failed.keys() & {"bundle.logits", "bundle.greedy"}, [r.to_json() for r in report.results]
    if "bundle.logits" in failed:
        assert "max |logit difference|" in failed["bundle.logits"] and "tokens [" in failed["bundle.logits"]
    if name == "mask-inverted":  # it reads cache slots not yet written: certify's own invariants catch it too
        return
    # a self-consistent other model: the bundle's own chunked and one-token forwards agree
    from specproof.engine.targets.coreml_eval import CoreMLEvalTarget

    t = CoreMLEvalTarget(path)
    whole = t.forward([1, 2, 3, 4, 5])
    t.reset()
    single = np.concatenate([t.forward([tok]) for tok in (1, 2, 3, 4, 5)])
    np.testing.assert_array_equal(whole, single)


# --------------------------------------------------------------------------- the command


@pytest.mark.slow
def test_cli_exit_codes(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _export(root, "lfm2-moe", "kv-mlstate")
    capsys.readouterr()
    assert cli.main(["bundle", "check", str(good), "--examples", "10", "--json"]) == 0  # --against from metadata
    doc = json.loads(capsys.readouterr().out)
    assert validate("bundle-check-1", doc) == []  # its JSON Schema (specproof/schemas/)
    assert doc["against"] == "family:lfm2-moe" and doc["verdict"] == "pass"
    assert [r["id"] for r in doc["results"]] == ["bundle.logits", "bundle.states", "bundle.greedy"]
    assert cli.main(["bundle", "check", str(good), "--against", "reference", "--examples", "5"]) == 1
    out = capsys.readouterr().out
    assert "fail" in out and "bundle.logits" in out and "verdict: FAIL" in out
    for argv, needle in (
        ([str(tmp_path / "none.mlpackage"), "--against", "family:lfm2-moe"], "does not exist"),
        ([str(good), "--against", "family:mamba"], "--family 'mamba'"),
        ([str(good), "--against", "reference:vocab_size=128"], "vocabulary is 256 tokens"),
        ([str(good), "--rtol", "0"], "rtol=0.0 must be a positive"),
        ([str(good), "--against", "nosuch"], "unknown target"),
    ):
        assert cli.main(["bundle", "check", *argv]) == 2, argv
        assert needle in capsys.readouterr().err, argv


def test_family_specs_rebuild_the_exported_source() -> None:
    a, b = load_target("family:qwen3.6-moe,max_context=64"), family_target("qwen3.6-moe", max_context=64)
    assert isinstance(a, ReferenceHybrid) and a.config == b.config
    assert all(np.array_equal(a.weights[n], w) for n, w in b.weights.items())
    with pytest.raises(PluginError, match="only max_context=N"):
        load_target("family:lfm2-moe,layers=attn")
    with pytest.raises(PluginError, match="--family 'gpt'"):
        load_target("family:gpt")


def test_options_are_checked_in_one_place() -> None:
    for kwargs, needle in (
        ({"examples": 0}, "examples=0"),
        ({"rtol": -1.0}, "rtol=-1.0"),
        ({"router_margin": -0.1}, "router-margin"),
        ({"max_tokens": True}, "max-tokens=True"),
    ):
        with pytest.raises(InvalidSettingError, match=needle):
            CheckOptions(**kwargs)  # type: ignore[arg-type]


def test_router_margins_skip_exact_ties() -> None:
    logits = np.array([[2.0, 2.0, 1.9, 0.0], [3.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :2]
    margins = router_margins(logits, chosen)
    # row 0: experts 0 and 1 tie exactly (not a margin); 2.0 - 1.9 is. Row 1: 3-1 and the exact 1-1 tie
    # skipped -> 2.0. Row 2: every pair ties exactly -> no margin at all
    np.testing.assert_allclose(margins, [0.1, 2.0, np.inf], rtol=1e-5)
    ref = family_target("lfm2-moe")
    ref.forward([1, 2, 3])
    assert len(ref.last_router_margins) == 4 and all(m.shape == (3,) for m in ref.last_router_margins)


def test_the_evaluator_imports_nothing_of_the_exporter() -> None:
    """The evaluator judges what the exporter wrote: it must not share code with it. Its modules import
    only the contract and each other from specproof (not specproof.coreml: the exporter, its blocks, options)."""
    for name in ("mil_eval.py", "coreml_eval.py", "coreml_eval_tree.py"):
        tree = ast.parse((SRC / "engine" / "targets" / name).read_text(encoding="utf-8"))
        imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
            a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
        }
        ours = {m for m in imported if m.startswith("specproof")}
        allowed = {
            "specproof.contract.errors",
            "specproof.engine.targets.mil_eval",
            "specproof.engine.targets.coreml",
            "specproof.engine.targets.coreml_eval",  # the tree target (coreml_eval_tree) builds on the chain one
        }
        assert ours <= allowed, (name, ours - allowed)


def test_the_evaluator_runs_the_slicing_ops_converters_write(tmp_path: Path) -> None:
    """slice_by_size (the torch frontend's slice), split (chunk), tile, sqrt, tanh, abs, pow: as numpy computes."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    from specproof.coreml import MilEvaluator

    @mb.program(input_specs=[mb.TensorSpec((2, 6), dtype=types.fp32)], opset_version=ct.target.iOS18)
    def prog(x):  # type: ignore[no-untyped-def]
        a = mb.slice_by_size(x=x, begin=[0, 1], size=[2, -1])  # [2, 5]
        b, c = mb.split(x=x, split_sizes=[2, 4], axis=1)
        d = mb.tile(x=b, reps=[1, 2])  # [2, 4]
        e = mb.add(x=mb.sqrt(x=mb.abs(x=c)), y=mb.tanh(x=d))
        return mb.identity(x=a, name="a"), mb.pow(x=e, y=2.0, name="e")

    model = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT32,  # fp32 through: compared with numpy exactly
        skip_model_load=True,
    )
    path = tmp_path / "slices.mlpackage"
    model.save(str(path))
    ev = MilEvaluator(path)
    x = np.arange(12, dtype=np.float32).reshape(2, 6) - 5.5
    out = ev(x=x)
    np.testing.assert_allclose(out["a"], x[:, 1:], rtol=1e-6)
    want = (np.sqrt(np.abs(x[:, 2:])) + np.tanh(np.tile(x[:, :2], (1, 2)))) ** 2
    np.testing.assert_allclose(out["e"], want, rtol=1e-5)
    assert {"slice_by_size", "split", "tile", "pow"} <= ev.op_types
