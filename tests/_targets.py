"""Small targets shared by the engine tests."""

from __future__ import annotations

from specproof.engine import ReferenceConfig, ReferenceHybrid


def small_config(**overrides: object) -> ReferenceConfig:
    base = dict(
        vocab_size=32,
        d_model=32,
        layers=("conv", "attn", "gdn", "conv"),
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        ffn_dim=64,
        gdn_heads=2,
        gdn_key_dim=8,
        gdn_value_dim=8,
        max_context=96,
        seed=3,
    )
    base.update(overrides)
    return ReferenceConfig(**base)  # type: ignore[arg-type]


def small_target(**overrides: object) -> ReferenceHybrid:
    return ReferenceHybrid(small_config(**overrides))
