"""``CoreMLTarget``: a clear refusal off macOS 15+; on macOS 15+, the exported bundle run by Core ML.

The macOS tests compare Core ML's logits with the reference (fp16 tolerance as in
``test_coreml_export``), greedy tokens with the golden file, snapshot/restore with a
fresh run, and the speculative decoder with the golden tokens.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np
import pytest

from specproof.engine import InvalidSettingError, MissingDependencyError, ReferenceConfig, ReferenceHybrid
from specproof.engine.targets.coreml import CoreMLTarget, CoreMLUnavailableError, load_spec


def _macos15() -> bool:
    if sys.platform != "darwin":
        return False
    try:
        return int(platform.mac_ver()[0].split(".")[0]) >= 15
    except ValueError:
        return False


MAC_REASON = "needs macOS 15+ (Core ML predict/make_state)"
needs_macos = pytest.mark.skipif(not _macos15(), reason=MAC_REASON)
EXPORT_CONFIG = ReferenceConfig(layers=("conv", "attn", "conv", "attn"), max_context=512)
LOGIT_TOL = 0.01  # relative to the largest |logit|, as in test_coreml_export


@pytest.mark.skipif(_macos15(), reason="checks the refusal off macOS 15+")
def test_construction_off_macos_raises_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CoreMLUnavailableError, match=r"needs macOS 15\+ \(Core ML predict/make_state\)") as info:
        CoreMLTarget(tmp_path / "any.mlpackage")
    assert isinstance(info.value, MissingDependencyError)
    with pytest.raises(CoreMLUnavailableError, match="macOS 15"):
        load_spec(str(tmp_path / "any.mlpackage"))


def test_bad_options_are_refused_before_anything_else(tmp_path: Path) -> None:
    with pytest.raises(InvalidSettingError, match="compute_units='GPU'"):
        CoreMLTarget(tmp_path / "x.mlpackage", compute_units="GPU")
    with pytest.raises(InvalidSettingError, match="only compute_units=UNITS"):
        load_spec("x.mlpackage,threads=4")
    with pytest.raises(InvalidSettingError, match="needs the path"):
        load_spec("")


# --------------------------------------------------------------------------- macOS 15+


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("coremltools")
    from specproof.coreml import export_bundle, write_golden

    root = tmp_path_factory.mktemp("coreml-target")
    ref = ReferenceHybrid(EXPORT_CONFIG)
    path = export_bundle(root / "ref.mlpackage", ref, k=4).path
    golden = root / "golden.json"
    write_golden(golden, ref, target_spec="reference:layers=conv+attn+conv+attn,max_context=512")
    return path, golden


@needs_macos
def test_logits_match_the_reference(exported: tuple[Path, Path]) -> None:
    target, ref = CoreMLTarget(exported[0], compute_units="CPU_ONLY"), ReferenceHybrid(EXPORT_CONFIG)
    assert (target.vocab_size, target.max_context, target.max_query) == (256, 512, 64)
    tokens = list(b"def area(width, height):\n    return width * height\n") * 2
    for chunk in (tokens[:20], tokens[20:21], tokens[21:26], tokens[26:]):  # the last chunk is > max_query
        got, want = target.forward(chunk), ref.forward(chunk)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= LOGIT_TOL * np.abs(want).max()
    assert target.processed == ref.processed == len(tokens)


@needs_macos
def test_greedy_matches_the_golden_file(exported: tuple[Path, Path]) -> None:
    from specproof.engine import greedy_decode

    doc = json.loads(exported[1].read_text(encoding="utf-8"))
    target = CoreMLTarget(exported[0])
    for case in doc["cases"]:
        gen = greedy_decode(target, case["prompt"], case["max_new_tokens"], eos_token_id=case["eos_token_id"])
        assert list(gen.tokens) == case["tokens"], case["prompt"]


@needs_macos
def test_snapshot_restore_through_read_and_write_state(exported: tuple[Path, Path]) -> None:
    target = CoreMLTarget(exported[0], compute_units="CPU_ONLY")
    target.forward([1, 2, 3, 4])
    snap = target.snapshot()
    first = target.forward([5, 6, 7])
    target.restore(snap)
    assert target.processed == 4
    again = target.forward([5, 6, 7])
    np.testing.assert_array_equal(first, again)  # same kernels, same inputs: bitwise
    states = target.state_arrays()
    assert states["key_cache"].shape == (2, 2, 7, 16) and set(states) == {"key_cache", "value_cache", "conv_state"}
    target.reset()
    assert target.processed == 0 and not target.state_arrays()["conv_state"].any()


@needs_macos
def test_speculative_decoding_on_core_ml_is_lossless(exported: tuple[Path, Path]) -> None:
    from specproof.engine import NgramDrafter, SpecDecoder

    doc = json.loads(exported[1].read_text(encoding="utf-8"))
    decoder = SpecDecoder(CoreMLTarget(exported[0]), NgramDrafter(), k=4, rollback="replay")
    for case in doc["cases"]:
        gen = decoder.generate(case["prompt"], case["max_new_tokens"], eos_token_id=case["eos_token_id"])
        assert list(gen.tokens) == case["tokens"], case["prompt"]
