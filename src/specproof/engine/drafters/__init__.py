"""Drafters shipped with specproof."""

from specproof.engine.drafters.ngram import NgramDrafter, naive_ngram_propose

__all__ = ["NgramDrafter", "naive_ngram_propose"]
