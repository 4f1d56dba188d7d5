"""Re-export: the records live in the bottom layer, ``specproof.contract``."""

from specproof.contract._records import STOP_REASONS, Generation, Stats, Step, StopReason

__all__ = ["STOP_REASONS", "Generation", "Stats", "Step", "StopReason"]
