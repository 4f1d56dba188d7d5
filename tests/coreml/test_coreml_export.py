"""``specproof bundle export``: the saved ML program computes the reference's function (runs on Linux).

Core ML cannot run here, so the saved program is evaluated op by op in numpy
(``specproof.coreml.MilEvaluator``: fp16 storage, fp32 accumulation, unknown ops fail loudly)
and compared with ``ReferenceHybrid``:

- logits within ``LOGIT_TOL`` = 1% of the chunk's largest |logit| (measured: about 0.3%);
- greedy tokens of every golden prompt equal, token for token;
- every reference weight is stored in the bundle, bitwise equal to its fp16 rounding.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")

from specproof import cli  # noqa: E402
from specproof.coreml import (  # noqa: E402
    GOLDEN_FORMAT,
    GOLDEN_PROMPTS,
    MilEvaluator,
    UnknownOpError,
    export_bundle,
    golden_cases,
    load_program,
)
from specproof.engine import InvalidSettingError, ReferenceConfig, ReferenceHybrid, greedy_decode  # noqa: E402

EXPORT_CONFIG = ReferenceConfig(layers=("conv", "attn", "conv", "attn"), max_context=512)
LOGIT_TOL = 0.01  # relative to the largest |logit| of the chunk


def _reference() -> ReferenceHybrid:
    """The export config with its norm weights perturbed away from 1, so none is an identity the converter drops."""
    weights = ReferenceHybrid(EXPORT_CONFIG).weights
    rng = np.random.default_rng(7)
    for name, w in weights.items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            weights[name] = (w + 0.2 * rng.standard_normal(w.shape)).astype(np.float32)
    return ReferenceHybrid(EXPORT_CONFIG, weights=weights)


@pytest.fixture(autouse=True)
def _bundle_command(monkeypatch: pytest.MonkeyPatch) -> None:
    if "specproof._cli.bundle" not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "specproof._cli.bundle"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_bundle(tmp_path_factory.mktemp("export") / "ref.mlpackage", _reference(), k=4).path


@pytest.fixture
def evaluator(bundle: Path) -> MilEvaluator:
    return MilEvaluator(bundle)


def _forward(ev: MilEvaluator, tokens: list[int], position: int) -> np.ndarray:
    out = ev(input_ids=np.array([tokens], np.int32), position=np.array([position], np.int32))["logits"]
    assert out.dtype == np.float32 and out.shape == (1, len(tokens), EXPORT_CONFIG.vocab_size)
    return out[0]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    tol = LOGIT_TOL * float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert err <= tol, f"max |logit error| {err:.4f} > {tol:.4f}"


def test_states_inputs_outputs(bundle: Path) -> None:
    spec = ct.utils.load_spec(str(bundle))
    ref = _reference()
    ref.forward([1] * EXPORT_CONFIG.max_context)  # full KV: state_arrays() then has the full-context shapes
    want = {name: a.shape for name, a in ref.state_arrays().items() if a.size}
    states = {s.name: tuple(s.type.stateType.arrayType.shape) for s in spec.description.state}
    assert states == want  # key_cache, value_cache, conv_state (no gdn block: rec_state is empty and absent)
    assert {s.type.stateType.arrayType.dataType for s in spec.description.state} == {
        ct.proto.FeatureTypes_pb2.ArrayFeatureType.FLOAT16
    }
    (ids, pos) = spec.description.input
    assert (ids.name, pos.name) == ("input_ids", "position")
    (rng,) = ids.type.multiArrayType.shapeRange.sizeRanges[1:]
    assert (rng.lowerBound, rng.upperBound) == (1, 64)
    assert [o.name for o in spec.description.output] == ["logits"]


def test_weights_are_the_references_in_fp16(bundle: Path) -> None:
    prog = load_program(bundle)
    consts = [np.asarray(op.outputs[0].val) for op in prog.functions["main"].operations if op.op_type == "const"]
    stored: dict[tuple[int, ...], list[np.ndarray]] = {}
    for c in consts:
        if c.dtype == np.float16 and c.size > 1:
            stored.setdefault(c.shape, []).append(c)
    assert not [c.shape for c in consts if c.dtype == np.float32 and c.size > 64], "large fp32 constants"
    for name, w in _reference().weights.items():
        want = w.astype(np.float16)
        same = [c for c in stored.get(want.shape, []) if c.tobytes() == want.tobytes()]
        assert same, f"weight {name} {want.shape} is not stored in the bundle as its fp16 rounding"


def test_chunked_forward_matches_the_reference(evaluator: MilEvaluator) -> None:
    ref = _reference()
    tokens = list(GOLDEN_PROMPTS[0]) + list(GOLDEN_PROMPTS[1])
    pos = 0
    for size in (17, 1, 5, 64, 3, 1, 1, 30):
        chunk = tokens[pos : pos + size]
        _close(_forward(evaluator, chunk, pos), ref.forward(chunk))
        pos += len(chunk)
    sa = ref.state_arrays()
    conv_err = np.abs(evaluator.states["conv_state"].astype(np.float32) - sa["conv_state"]).max()
    assert conv_err <= LOGIT_TOL * np.abs(sa["conv_state"]).max()
    kv = evaluator.states["key_cache"][:, :, :pos].astype(np.float32)
    assert np.abs(kv - sa["key_cache"]).max() <= LOGIT_TOL * np.abs(sa["key_cache"]).max()
    assert not evaluator.states["key_cache"][:, :, pos:].any()  # nothing written past processed


def test_verify_rows_equal_one_token_rows(evaluator: MilEvaluator, bundle: Path) -> None:
    # a K+1 verify forward gives the rows K+1 decode steps give (within fp16), and the same argmax
    prompt = list(GOLDEN_PROMPTS[2])
    _forward(evaluator, prompt, 0)
    verify = _forward(evaluator, [97, 98, 99, 97, 98], len(prompt))
    steps = MilEvaluator(bundle)
    _forward(steps, prompt, 0)
    rows = [_forward(steps, [t], len(prompt) + i)[0] for i, t in enumerate([97, 98, 99, 97, 98])]
    _close(verify, np.stack(rows))
    assert (verify.argmax(-1) == np.stack(rows).argmax(-1)).all()


def _mil_greedy(ev: MilEvaluator, prompt: list[int], n: int) -> list[int]:
    ev.reset()
    ctx = list(prompt)
    if len(ctx) > 1:
        _forward(ev, ctx[:-1], 0)
    out = []
    for _ in range(n):
        row = _forward(ev, [ctx[-1]], len(ctx) - 1)[0]
        ctx.append(int(row.argmax()))
        out.append(ctx[-1])
    return out


def test_greedy_tokens_equal_the_reference(evaluator: MilEvaluator) -> None:
    for case in golden_cases(_reference(), max_new_tokens=24):
        assert _mil_greedy(evaluator, case["prompt"], 24) == case["tokens"], case["prompt"]


def test_last_token_only_variant(tmp_path: Path) -> None:
    path = export_bundle(tmp_path / "last.mlpackage", _reference(), k=4, last_token_only=True).path
    ev = MilEvaluator(path)
    prompt = list(GOLDEN_PROMPTS[0])
    out = ev(input_ids=np.array([prompt], np.int32), position=np.array([0], np.int32))["logits"]
    assert out.shape == (1, 1, EXPORT_CONFIG.vocab_size)
    _close(out[0], _reference().forward(prompt)[-1:])


def test_evaluator_fails_loudly_on_an_unknown_op(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specproof.engine.targets import mil_eval

    monkeypatch.delitem(mil_eval.OPS, "conv")
    with pytest.raises(UnknownOpError, match=r"ML program '.*ref\.mlpackage' .*op type 'conv' is not implemented"):
        MilEvaluator(bundle)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (ReferenceConfig(layers=("attn", "attn")), "at least one 'attn' block and one 'conv' or 'gdn' block"),
        (ReferenceConfig(layers=("conv", "gdn")), "at least one 'attn' block"),
        (ReferenceConfig(layers=("conv", "attn"), conv_kernel=1), "conv_kernel=1 leaves conv_state zero-sized"),
    ],
)
def test_unsupported_configs_are_refused(config: ReferenceConfig, needle: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidSettingError, match=needle):
        export_bundle(tmp_path / "x.mlpackage", ReferenceHybrid(config), k=4)
    assert not (tmp_path / "x.mlpackage").exists()


def test_bad_options_are_refused(tmp_path: Path) -> None:
    target = ReferenceHybrid(EXPORT_CONFIG)
    with pytest.raises(InvalidSettingError, match="max_query=4 must be an integer >= k \\+ 1 = 5"):
        export_bundle(tmp_path / "x.mlpackage", target, k=4, max_query=4)
    with pytest.raises(InvalidSettingError, match="k=0"):
        export_bundle(tmp_path / "x.mlpackage", target, k=0)
    with pytest.raises(InvalidSettingError, match=r"must end in \.mlpackage"):
        export_bundle(tmp_path / "x.mlmodel", target, k=4)


def test_cli_export_with_golden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, golden = tmp_path / "b.mlpackage", tmp_path / "golden.json"
    argv = ["bundle", "export", str(out), "--k", "4", "--max-query", "8", "--golden", str(golden)]
    assert cli.main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    doc = json.loads(golden.read_text(encoding="utf-8"))
    assert doc["format"] == GOLDEN_FORMAT
    assert doc["target"] == "reference:layers=conv+attn+conv+attn,max_context=512"
    assert [c["prompt"] for c in doc["cases"]] == [list(p) for p in GOLDEN_PROMPTS]
    ref = ReferenceHybrid(EXPORT_CONFIG)
    for case in doc["cases"]:
        assert set(case) == {"prompt", "max_new_tokens", "eos_token_id", "tokens"} and case["eos_token_id"] is None
        assert case["tokens"] == list(greedy_decode(ref, case["prompt"], case["max_new_tokens"]).tokens)
    # the bundle qualifies for K=4 but not K=8 (the token range is 1..8); an existing path needs --force
    assert cli.main(["bundle", "inspect", str(out), "--k", "7"]) == 0
    assert cli.main(["bundle", "inspect", str(out), "--k", "8"]) == 1
    capsys.readouterr()
    assert cli.main(argv) == 2
    assert "--force" in capsys.readouterr().err
    assert cli.main([*argv, "--force", "--target", "reference:layers=conv+gdn"]) == 2
    assert "at least one 'attn' block" in capsys.readouterr().err
