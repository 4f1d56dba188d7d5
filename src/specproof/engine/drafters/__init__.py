"""Drafters shipped with specproof.

``NgramDrafter`` (prompt lookup), ``ModelDrafter`` (a draft model), ``CombinedDrafter``,
``HeadDrafter`` (feature heads) and ``SuffixDrafter``. Command-line drafter specs
(``--drafter ngram``, ``model:TARGET``, ...) resolve in ``specproof.plugins``.
"""

from __future__ import annotations

from specproof.engine.drafters.combined import CombinedDrafter
from specproof.engine.drafters.heads import FeatureHead, HeadDrafter
from specproof.engine.drafters.model import DraftRollback, ModelDrafter
from specproof.engine.drafters.ngram import NgramDrafter, naive_ngram_propose
from specproof.engine.drafters.suffix import SuffixDrafter

__all__ = [
    "CombinedDrafter",
    "DraftRollback",
    "FeatureHead",
    "HeadDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "SuffixDrafter",
    "naive_ngram_propose",
]
