"""Decode parameters in the engine-case search (docs/contract.md, "Decode state", "In the engine-case search").

With ``--decode-state`` the one search of an engine case draws, beside its prompt, k, budget, EOS and round
plan, the logits processors the case declares (``processor_configs``: penalties, a logit bias, bad words),
half the time; its runs are then judged against plain decoding with those processors
(``contract.decode_state.plain_decode_with``), so every engine invariant (lossless output, the target's
state after each round and at the end, the drafts used, the stats) is judged on requests with decode-time
state too. Without the option nothing is drawn: the search's examples are unchanged.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from specproof.conformance.checks.decode_state import PROCESSOR_FEATURES
from specproof.contract import DecodeParams
from specproof.engine import SpecDecoder
from specproof.strategies import processor_configs

__all__ = ["case_processor_features", "draw_case_decode"]


def case_processor_features(case: Any) -> frozenset[str]:
    """The processors an engine case declares: all of them for the built-in decoder, else the plug-in's
    ``decode_features`` among them (none where it declares none, or declares something that is not a name)."""
    declared = SpecDecoder.decode_features if case.kind == "builtin" else getattr(case.engine, "decode_features", None)
    if not isinstance(declared, (tuple, list, frozenset, set)):
        return frozenset()
    return frozenset(f for f in declared if isinstance(f, str)) & PROCESSOR_FEATURES


def draw_case_decode(data: st.DataObject, case: Any, vocab: int) -> DecodeParams | None:
    """Half the time, the processors the case declares (strengths drawn, shrinking to off); None otherwise,
    or where the case declares none or has no model to decode plainly with."""
    features = case_processor_features(case)
    if not features or vocab < 2 or (case.kind != "builtin" and case.make_reference is None):
        return None
    if not data.draw(st.booleans(), label="with decode processors"):
        return None
    params: DecodeParams = data.draw(processor_configs(vocab, features=features), label="decode processors")
    return params if params.features() else None
