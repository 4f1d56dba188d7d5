"""specproof: a property-based verification and conformance suite for lossless greedy
speculative decoding on hybrid (attention + recurrent state) language models."""

__version__ = "0.1.0"
