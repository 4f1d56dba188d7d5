"""The trained fixture as the GGUF file llama.cpp loads (``specproof export gguf``), checked without llama.cpp.

Needs only the ``gguf`` package (skipped without it). The file is read back with ``gguf.GGUFReader``
and a model is rebuilt from it with this test's own table of llama.cpp's tensor names (written out
from llama.cpp's ``llama-arch.cpp``, not taken from ``gguf``'s map that the writer uses); the rebuilt
model's logits must equal the fixture's at every position of a prompt. Meta-tests: an export that
swaps the feed-forward's gate and up projections, or lays the conv kernel out transposed, is
rejected by the same comparison; an export that writes an explicit (untied) output head, which
llama.cpp also loads, is accepted. tests/frameworks/test_llamacpp_engine.py runs the file in llama.cpp.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="needs the gguf package: pip install 'specproof[llamacpp]'")

from specproof.contract.compare import arrays_differ  # noqa: E402
from specproof.engine import ReferenceHybrid  # noqa: E402
from specproof.engine.targets import lfm2_gguf  # noqa: E402
from specproof.engine.targets.lfm2_gguf import read_gguf_source, save_lfm2_gguf  # noqa: E402
from specproof.fixtures import load_trained_target  # noqa: E402

# llama.cpp's names (llama-arch.cpp, LLM_ARCH_LFM2) -> the reference's (Hugging Face Lfm2ForCausalLM) names
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "token_embd_norm.weight": "model.embedding_norm.weight",  # LFM2's final norm (LLM_TENSOR_OUTPUT_NORM_LFM2)
    "output.weight": "lm_head.weight",
}
BLOCK_NAMES = {
    "attn_norm": "operator_norm",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "feed_forward.w1",
    "ffn_up": "feed_forward.w3",
    "ffn_down": "feed_forward.w2",
    "shortconv.in_proj": "conv.in_proj",
    "shortconv.conv": "conv.conv",
    "shortconv.out_proj": "conv.out_proj",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.out_proj",
    "attn_q_norm": "self_attn.q_layernorm",
    "attn_k_norm": "self_attn.k_layernorm",
}


@pytest.fixture(scope="module")
def reference() -> ReferenceHybrid:
    return load_trained_target("max_context=512")


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return list((b"def __init__(self, name):\n    self.name = name\n    self.items = []\n" * 4)[:240])


@pytest.fixture(scope="module")
def exported(reference: ReferenceHybrid, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_lfm2_gguf(reference, tmp_path_factory.mktemp("gguf") / "trained", source="trained")


def _scalar(reader: Any, key: str) -> Any:
    field = reader.fields[key]
    if field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode()
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return [field.parts[i][0].item() if field.types[-1] != gguf.GGUFValueType.STRING else bytes(field.parts[i])
                for i in field.data]  # fmt: skip
    return field.parts[field.data[0]][0].item()


def rebuild(path: Path, like: ReferenceHybrid) -> ReferenceHybrid:
    """A ``ReferenceHybrid`` from the GGUF alone: its metadata and its tensors under llama.cpp's names."""
    reader = gguf.GGUFReader(str(path))
    assert _scalar(reader, "general.architecture") == "lfm2"
    weights: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32, tensor.name
        name = tensor.name
        if name in GLOBAL_NAMES:
            ours = GLOBAL_NAMES[name]
        else:
            blk, layer, rest = name.split(".", 2)
            assert blk == "blk" and rest.endswith(".weight"), name
            ours = f"model.layers.{layer}.{BLOCK_NAMES[rest[: -len('.weight')]]}.weight"
        value = np.array(tensor.data, dtype=np.float32)
        if ours.endswith("conv.conv.weight"):
            value = value[:, None, :]  # llama.cpp's [d, L] -> the reference's [d, 1, L]
        weights[ours] = value
    kv = _scalar(reader, "lfm2.attention.head_count_kv")
    cfg = attrs.evolve(
        like.config,
        vocab_size=_scalar(reader, "lfm2.vocab_size"),
        d_model=_scalar(reader, "lfm2.embedding_length"),
        layers=tuple("conv" if n == 0 else "attn" for n in kv),
        n_heads=_scalar(reader, "lfm2.attention.head_count"),
        n_kv_heads=max(kv),
        head_dim=_scalar(reader, "lfm2.embedding_length") // _scalar(reader, "lfm2.attention.head_count"),
        ffn_dim=_scalar(reader, "lfm2.feed_forward_length"),
        conv_kernel=_scalar(reader, "lfm2.shortconv.l_cache"),
        rope_theta=_scalar(reader, "lfm2.rope.freq_base"),
        norm_eps=_scalar(reader, "lfm2.attention.layer_norm_rms_epsilon"),
        tie_embeddings="lm_head.weight" not in weights,
    )
    return ReferenceHybrid(cfg, weights=weights)


def _logits(model: ReferenceHybrid, prompt: list[int]) -> np.ndarray:
    model.reset()
    return model.forward(prompt)


def test_the_file_rebuilds_the_fixture_exactly(reference, prompt, exported) -> None:
    rebuilt = rebuild(exported, reference)
    assert rebuilt.config.layers == ("conv", "attn", "conv", "attn") and rebuilt.config.head_dim == 24
    want, got = _logits(reference, prompt), _logits(rebuilt, prompt)
    assert want.shape == (len(prompt), 256)
    assert arrays_differ(want, got, atol=0.0, name="rebuilt logits") is None  # the same float32 values, same code


def test_the_metadata_llama_cpp_reads(exported) -> None:
    reader = gguf.GGUFReader(str(exported))
    assert _scalar(reader, "lfm2.attention.head_count_kv") == [0, 2, 0, 2]  # 0 marks llama.cpp's recurrent layers
    assert _scalar(reader, "lfm2.context_length") == 512
    assert _scalar(reader, "tokenizer.ggml.model") == "llama"
    tokens = _scalar(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == 256 and tokens[10] == b"<0x0A>" and len(set(tokens)) == 256
    assert set(_scalar(reader, "tokenizer.ggml.token_type")) == {int(gguf.TokenType.BYTE)}
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied: llama.cpp reuses token_embd
    assert read_gguf_source(exported) == "trained"
    assert _scalar(reader, "specproof.format") == lfm2_gguf.GGUF_FORMAT


def _export_with(reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change) -> Path:
    original = lfm2_gguf.gguf_tensors
    monkeypatch.setattr(lfm2_gguf, "gguf_tensors", lambda ref: change(dict(original(ref))))
    return save_lfm2_gguf(reference, tmp_path / "changed.gguf", source="trained")


def test_an_export_that_swaps_gate_and_up_is_rejected(reference, prompt, tmp_path, monkeypatch) -> None:
    def swap(t: dict) -> dict:
        for i in range(4):
            t[f"blk.{i}.ffn_gate.weight"], t[f"blk.{i}.ffn_up.weight"] = (
                t[f"blk.{i}.ffn_up.weight"], t[f"blk.{i}.ffn_gate.weight"],
            )  # fmt: skip
        return t

    rebuilt = rebuild(_export_with(reference, tmp_path, monkeypatch, swap), reference)
    assert arrays_differ(_logits(reference, prompt), _logits(rebuilt, prompt), atol=1e-3) is not None


def test_an_export_with_the_conv_kernel_transposed_is_rejected(reference, prompt, tmp_path, monkeypatch) -> None:
    def transpose(t: dict) -> dict:
        for i in (0, 2):
            w = t[f"blk.{i}.shortconv.conv.weight"]  # [96, 4] -> the same shape, kernel taps reversed
            t[f"blk.{i}.shortconv.conv.weight"] = np.ascontiguousarray(w[:, ::-1])
        return t

    rebuilt = rebuild(_export_with(reference, tmp_path, monkeypatch, transpose), reference)
    assert arrays_differ(_logits(reference, prompt), _logits(rebuilt, prompt), atol=1e-3) is not None


def test_an_export_with_an_explicit_output_head_is_accepted(reference, prompt, tmp_path, monkeypatch) -> None:
    def untie(t: dict) -> dict:
        t["output.weight"] = np.array(t["token_embd.weight"])
        return t

    path = _export_with(reference, tmp_path, monkeypatch, untie)
    rebuilt = rebuild(path, reference)
    assert rebuilt.config.tie_embeddings is False
    assert arrays_differ(_logits(reference, prompt), _logits(rebuilt, prompt), atol=0.0) is None


def test_export_command_writes_the_file_and_refuses_what_cannot_be_exported(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "specproof", "export", "gguf"]
    done = subprocess.run([*run, str(tmp_path / "dir")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dir" / "model.gguf").is_file() and "lfm2 GGUF" in done.stdout
    done = subprocess.run([*run, str(tmp_path / "x.gguf")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and (tmp_path / "x.gguf").is_file(), done.stderr
    for extra, message in ((["--head-dim", "32"], "--head-dim applies to `export vllm` only"),
                           (["--target", "reference"], "only 'conv' and 'attn' blocks")):  # fmt: skip
        bad = subprocess.run([*run, str(tmp_path / "y"), *extra], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
        assert message in bad.stderr, bad.stderr
