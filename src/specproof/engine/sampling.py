"""The reference engine's sampler, public: what ``SpecDecoder`` samples with (docs/contract.md, "Sampling").

``target_distribution(row, params)`` is the engine's processed distribution ``p`` of one logits row;
``draw(probs, rng)`` one token on one uniform; ``rejection_accept_tokens`` and ``match_accept_tokens``
the two lossless acceptance rules over one verify forward; ``sampled_tree_accept`` the sampled tree rule
(recursive rejection over siblings, docs/contract.md "Sampled trees"). Layers above the engine (the bench's
sampled figures) use these to measure what the engine does. The conformance checks do not: they
judge the engine with ``specproof.contract.processed_distribution``, written separately.
"""

from __future__ import annotations

from specproof.engine._sampling import draw, match_accept_tokens, rejection_accept_tokens, target_distribution
from specproof.engine._tree_sampling import sampled_tree_accept

__all__ = ["draw", "match_accept_tokens", "rejection_accept_tokens", "sampled_tree_accept", "target_distribution"]
