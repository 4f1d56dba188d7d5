"""Reference weights in mlx-lm's ``lfm2`` and transformers' ``Lfm2ForCausalLM``: three implementations, one model.

Logits agree within ``ATOL`` (float32; measured max |diff| ~5e-5 on logits of magnitude ~28) and
greedy tokens agree exactly. Qwen3.5: the same seeded weights give the same logits in both frameworks.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from specproof.engine import InvalidSettingError, ReferenceConfig, ReferenceHybrid, greedy_decode
from specproof.engine.targets.convert import (
    check_lfm2_compatible,
    lfm2_config,
    reference_to_hf_lfm2,
    reference_to_mlx_lfm2,
    tiny_lfm2_config,
    tiny_lfm2_reference,
)

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

ATOL = 5e-4
HAS_MLX = importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None
HAS_HF = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
needs_mlx = pytest.mark.skipif(not HAS_MLX, reason="needs the mlx extra: pip install 'specproof[mlx]'")
needs_hf = pytest.mark.skipif(not HAS_HF, reason="needs the hf extra: pip install 'specproof[hf]'")

PROMPTS = [list(b"the cat sat on the mat. the cat sat"), list(b"q"), [0, 255, 17, 3, 3, 3, 3, 3]]
CONFIGS = [
    tiny_lfm2_config(seed=0),
    # GQA 8q/2kv, a longer conv, untied head (transformers only), other theta / eps
    ReferenceConfig(
        vocab_size=300,
        d_model=64,
        layers=("attn", "conv", "attn"),
        n_heads=8,
        n_kv_heads=2,
        head_dim=8,
        ffn_dim=96,
        conv_kernel=4,
        rope_theta=1e6,
        norm_eps=1e-6,
        max_context=128,
        seed=5,
        tie_embeddings=False,
    ),
]

if HAS_HF:
    import torch

    torch.set_num_threads(1)  # tiny models on shared cores


def _hf_logits(model: object, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].numpy()  # type: ignore[operator, no-any-return]


def _mlx_logits(model: object, tokens: list[int]) -> np.ndarray:
    import mlx.core as mx

    return np.array(model(mx.array([tokens]))[0])  # type: ignore[operator]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"layers": ("conv", "gdn", "attn")}, r"layers\[1\]='gdn'"),
        ({"n_experts": 4}, "n_experts=4"),
        ({"head_dim": 8}, "head_dim=8"),
    ],
)
def test_incompatible_reference_configs_are_refused(change: dict[str, object], match: str) -> None:
    base = dict(vocab_size=64, d_model=32, layers=("conv", "attn"), n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=32)
    base.update(change)
    cfg = ReferenceConfig(**base)  # type: ignore[arg-type]
    for framework in ("hf", "mlx"):
        with pytest.raises(InvalidSettingError, match=match):
            check_lfm2_compatible(cfg, framework=framework)
    with pytest.raises(InvalidSettingError, match=match):
        reference_to_hf_lfm2(ReferenceHybrid(cfg))
    with pytest.raises(InvalidSettingError, match=match):
        reference_to_mlx_lfm2(ReferenceHybrid(cfg))


def test_mlx_only_limits() -> None:
    untied = ReferenceConfig(
        vocab_size=64,
        d_model=32,
        layers=("conv", "attn"),
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        ffn_dim=32,
        tie_embeddings=False,
    )
    check_lfm2_compatible(untied, framework="hf")
    with pytest.raises(InvalidSettingError, match="ties the output head"):
        check_lfm2_compatible(untied, framework="mlx")
    attn_only = ReferenceConfig(
        vocab_size=64, d_model=32, layers=("attn",), n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=32
    )
    with pytest.raises(InvalidSettingError, match="at least one 'attn' and one 'conv'"):
        check_lfm2_compatible(attn_only, framework="mlx")
    with pytest.raises(InvalidSettingError, match="expected a ReferenceHybrid"):
        reference_to_hf_lfm2("reference")  # type: ignore[arg-type]


def test_config_disables_ffn_auto_adjust() -> None:
    cfg = lfm2_config(tiny_lfm2_config())
    assert cfg["block_auto_adjust_ff_dim"] is False
    assert cfg["intermediate_size"] == cfg["block_ff_dim"] == 128
    assert cfg["layer_types"] == ["conv", "full_attention", "conv", "conv", "full_attention", "conv"]


@needs_hf
@pytest.mark.parametrize("cfg", CONFIGS, ids=["tiny", "gqa8-untied"])
def test_reference_equals_transformers_lfm2(cfg: ReferenceConfig) -> None:
    ref = ReferenceHybrid(cfg)
    model = reference_to_hf_lfm2(ref)
    assert model.model.layers[0].feed_forward.w1.weight.shape == (cfg.ffn_dim, cfg.d_model)
    for prompt in PROMPTS:
        prompt = [t % cfg.vocab_size for t in prompt]
        ref.reset()
        np.testing.assert_allclose(_hf_logits(model, prompt), ref.forward(prompt), rtol=0, atol=ATOL)


@needs_mlx
def test_reference_equals_mlx_lm_lfm2() -> None:
    ref = tiny_lfm2_reference(seed=0)
    model = reference_to_mlx_lfm2(ref)
    assert model.layers[0].feed_forward.w1.weight.shape == (128, 64)
    for prompt in PROMPTS:
        ref.reset()
        np.testing.assert_allclose(_mlx_logits(model, prompt), ref.forward(prompt), rtol=0, atol=ATOL)


@needs_hf
@needs_mlx
@pytest.mark.parametrize("seed", [0, 1])
def test_three_implementations_same_greedy_tokens(seed: int) -> None:
    from specproof.engine.targets.hf import HFTarget
    from specproof.engine.targets.mlx import MLXTarget

    ref = tiny_lfm2_reference(seed=seed)
    hf = HFTarget(reference_to_hf_lfm2(ref), max_context=ref.max_context)
    mlx = MLXTarget(reference_to_mlx_lfm2(ref), max_context=ref.max_context)
    for prompt in PROMPTS:
        expected = greedy_decode(ref, prompt, 32).tokens
        assert greedy_decode(hf, prompt, 32).tokens == expected
        assert greedy_decode(mlx, prompt, 32).tokens == expected


@needs_hf
@needs_mlx
def test_qwen3_5_same_weights_same_logits_in_both_frameworks() -> None:
    from specproof.engine.targets import hf, mlx

    a, b = hf.load_spec("qwen3_5-tiny"), mlx.load_spec("qwen3_5-tiny")
    for prompt in PROMPTS:
        a.reset()
        b.reset()
        np.testing.assert_allclose(a.forward(prompt), b.forward(prompt), rtol=0, atol=ATOL)
    assert greedy_decode(a, PROMPTS[0], 32).tokens == greedy_decode(b, PROMPTS[0], 32).tokens


@pytest.mark.skipif(HAS_MLX, reason="checks the error for a missing mlx extra, and the extra is installed")
def test_missing_mlx_extra_says_what_to_install() -> None:
    from specproof.engine import MissingDependencyError
    from specproof.engine.targets import mlx

    with pytest.raises(MissingDependencyError, match=r"install specproof\[mlx\]"):
        mlx.load_spec("lfm2-tiny")


@pytest.mark.skipif(HAS_HF, reason="checks the error for a missing hf extra, and the extra is installed")
def test_missing_hf_extra_says_what_to_install() -> None:
    from specproof.engine import MissingDependencyError
    from specproof.engine.targets import hf

    with pytest.raises(MissingDependencyError, match=r"install specproof\[hf\]"):
        hf.load_spec("lfm2-tiny")
