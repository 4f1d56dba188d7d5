"""Re-export: the protocols live in the bottom layer, ``specproof.contract``."""

from specproof.contract._protocols import (
    CheckpointingTarget,
    Drafter,
    Engine,
    FeatureDrafter,
    FeatureTarget,
    Target,
    WhiteBoxTarget,
)

__all__ = ["CheckpointingTarget", "Drafter", "Engine", "FeatureDrafter", "FeatureTarget", "Target", "WhiteBoxTarget"]
