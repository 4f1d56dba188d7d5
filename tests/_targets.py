"""Small targets shared by the engine tests."""

from __future__ import annotations

import attrs

from specproof.conformance.zoo import ZOO_CONFIG
from specproof.engine import ReferenceConfig, ReferenceHybrid


def small_config(**overrides: object) -> ReferenceConfig:
    """The zoo's architecture (every block kind, all four states) with a smaller vocabulary and context."""
    return attrs.evolve(ZOO_CONFIG, **{"vocab_size": 32, "max_context": 96, "seed": 3, **overrides})  # type: ignore[arg-type]


def small_target(**overrides: object) -> ReferenceHybrid:
    return ReferenceHybrid(small_config(**overrides))
