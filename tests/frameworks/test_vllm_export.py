"""The trained fixture in the shape vLLM loads: heads padded 24 -> 32 by an exact re-embedding.

Numpy only (no vLLM, no torch): the padded weights are run by the reference forward
(``ReferenceHybrid`` with the padded config), which shares no code with the padding rules, and
its logits are compared with the unpadded fixture's at every position of a prompt. Meta-tests:
a padding that forgets the rope-theta rescaling, or lays the zero dimensions at the end of each
head (splitting a rotate-half pair), is rejected by the same comparison.
"""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest

from specproof.contract.compare import arrays_differ
from specproof.engine import InvalidSettingError, ReferenceHybrid
from specproof.engine.targets.convert import VLLM_CPU_HEAD_SIZES, pad_lfm2_heads, save_vllm_lfm2
from specproof.fixtures import load_trained_target

# float32 rounding of sums over 128 instead of 96 terms; logits reach ~20 in magnitude
ATOL = 2e-4


@pytest.fixture(scope="module")
def reference() -> ReferenceHybrid:
    return load_trained_target("max_context=512")


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    text = b"def __init__(self, name):\n    self.name = name\n    self.items = []\n" * 4
    return list(text[:300])


def _logits(model: ReferenceHybrid, prompt: list[int]) -> np.ndarray:
    model.reset()
    return model.forward(prompt)


def test_padded_heads_compute_the_reference_logits_at_every_position(reference, prompt) -> None:
    padded = pad_lfm2_heads(reference, head_dim=32)
    assert padded.config.head_dim == 32 and padded.config.d_model == 128
    want, got = _logits(reference, prompt), _logits(padded, prompt)
    assert want.shape == (len(prompt), 256)
    assert arrays_differ(want, got, atol=ATOL, name="padded logits") is None
    assert (want.argmax(-1) == got.argmax(-1)).all()


def test_padding_to_a_larger_size_is_exact_too(reference, prompt) -> None:
    padded = pad_lfm2_heads(reference, head_dim=64)
    assert arrays_differ(_logits(reference, prompt), _logits(padded, prompt), atol=ATOL) is None


def test_a_padding_without_the_rope_theta_rescaling_is_rejected(reference, prompt) -> None:
    padded = pad_lfm2_heads(reference, head_dim=32)
    wrong = ReferenceHybrid(attrs.evolve(padded.config, rope_theta=reference.config.rope_theta), weights=padded.weights)
    assert arrays_differ(_logits(reference, prompt), _logits(wrong, prompt), atol=ATOL) is not None


def test_a_padding_with_zeros_at_the_end_of_each_head_is_rejected(reference, prompt) -> None:
    padded = pad_lfm2_heads(reference, head_dim=32)
    w = dict(padded.weights)
    # move each head's real dims to 0..23 (zeros 24..31): the rotate-half pairs (j, j+16) split
    for name, heads in (("q_proj", 4), ("k_proj", 2)):
        for layer in (1, 3):
            key = f"model.layers.{layer}.self_attn.{name}.weight"
            rows = w[key].reshape(heads, 2, 16, -1)[:, :, :12].reshape(heads, 24, -1)
            moved = np.zeros((heads, 32, rows.shape[-1]), np.float32)
            moved[:, :24] = rows
            w[key] = moved.reshape(heads * 32, -1)
    wrong = ReferenceHybrid(padded.config, weights=w)
    assert arrays_differ(_logits(reference, prompt), _logits(wrong, prompt), atol=ATOL) is not None


def test_a_correct_padding_laid_out_differently_is_accepted(reference, prompt) -> None:
    # a permutation of the residual stream's dimensions (applied consistently) is another exact embedding
    padded = pad_lfm2_heads(reference, head_dim=32)
    perm = np.random.default_rng(1).permutation(128)
    w = {}
    for name, value in padded.weights.items():
        v = np.array(value)
        if (name.endswith(("norm.weight",)) and v.shape == (128,)) or name.endswith("conv.conv.weight"):
            v = v[perm]
        elif name == "model.embed_tokens.weight" or name.endswith(
            ("q_proj.weight", "k_proj.weight", "v_proj.weight", "w1.weight", "w3.weight")
        ):
            v = v[:, perm]
        elif name.endswith(("self_attn.out_proj.weight", "w2.weight")):
            v = v[perm]
        elif name.endswith("conv.in_proj.weight"):
            v = v[:, perm].reshape(3, 128, 128)[:, perm].reshape(384, 128)
        elif name.endswith("conv.out_proj.weight"):
            v = v[perm][:, perm]
        w[name] = v
    other = ReferenceHybrid(padded.config, weights=w)
    assert arrays_differ(_logits(reference, prompt), _logits(other, prompt), atol=ATOL) is None


def test_bad_head_dims_are_clear_errors(reference) -> None:
    with pytest.raises(InvalidSettingError, match="head_dim=16 must be an even int >= the model's head_dim=24"):
        pad_lfm2_heads(reference, head_dim=16)
    with pytest.raises(InvalidSettingError, match="head_dim=33"):
        pad_lfm2_heads(reference, head_dim=33)


def test_the_exported_directory_holds_what_vllm_reads(reference, prompt, tmp_path) -> None:
    from safetensors.numpy import load_file

    out = save_vllm_lfm2(reference, str(tmp_path / "lfm2"), source="trained")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "lfm2" and config["architectures"] == ["Lfm2ForCausalLM"]
    assert config["conv_dim"] == config["conv_dim_out"] == config["hidden_size"] == 128
    assert config["hidden_size"] // config["num_attention_heads"] == 32 in VLLM_CPU_HEAD_SIZES
    assert config["norm_eps"] == pytest.approx(0.75e-5)
    assert config["rope_theta"] == pytest.approx(10000.0 ** (32 / 24))
    assert config["specproof"]["source"] == "trained"
    weights = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in weights  # tied
    # the files alone (config + weights) rebuild a model with the reference's logits
    cfg = attrs.evolve(
        reference.config,
        d_model=config["hidden_size"],
        head_dim=config["head_dim"],
        rope_theta=config["rope_theta"],
        norm_eps=config["norm_eps"],
    )
    rebuilt = ReferenceHybrid(cfg, weights=weights)
    assert arrays_differ(_logits(reference, prompt), _logits(rebuilt, prompt), atol=ATOL) is None
