"""specproof: a property-based verification and conformance suite for lossless speculative
decoding on hybrid (attention + recurrent state) language models.

This module is the public API (docs/contract.md, "Stability"): the protocols a subject
implements, the records it returns, the certify entry points, the registry and the Hypothesis
strategies and state machines. Everything is imported lazily, so ``import specproof`` is cheap
and no layer below imports this facade.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from specproof._version import __version__

# name -> the module that defines it (the one place each public name is mapped)
_EXPORTS: dict[str, str] = {
    # protocols a subject implements (specproof.contract)
    "Target": "specproof.contract",
    "CheckpointingTarget": "specproof.contract",
    "WhiteBoxTarget": "specproof.contract",
    "FeatureTarget": "specproof.contract",
    "Drafter": "specproof.contract",
    "FeatureDrafter": "specproof.contract",
    "Engine": "specproof.contract",
    # the records an engine returns
    "Generation": "specproof.contract",
    "Step": "specproof.contract",
    "Stats": "specproof.contract",
    "StopReason": "specproof.contract",
    # verdict building blocks and errors
    "Violation": "specproof.contract",
    "ViolationError": "specproof.contract",
    "SpecproofError": "specproof.contract",
    "UsageError": "specproof.contract",
    # the reference engine
    "SpecDecoder": "specproof.engine",
    "DecodeSession": "specproof.engine",
    "NgramDrafter": "specproof.engine",
    "ReferenceHybrid": "specproof.engine",
    "ReferenceConfig": "specproof.engine",
    "greedy_decode": "specproof.engine",
    # certifying
    "certify": "specproof.conformance",
    "check": "specproof.conformance",
    "parametrize_with_checks": "specproof.conformance",
    "CheckResult": "specproof.conformance",
    "Report": "specproof.conformance",
    "REGISTRY": "specproof.conformance",
    "Invariant": "specproof.conformance",
    # fuzzing
    "contexts": "specproof.strategies",
    "round_plans": "specproof.strategies",
    "ScriptedDrafter": "specproof.strategies",
    "RollbackMachine": "specproof.strategies",
    "SessionMachine": "specproof.strategies",
    "target_greedy": "specproof.strategies",
    "engine_greedy": "specproof.strategies",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specproof' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # static type checkers see the real names
    from specproof.conformance import (
        REGISTRY,
        CheckResult,
        Invariant,
        Report,
        certify,
        check,
        parametrize_with_checks,
    )
    from specproof.contract import (
        CheckpointingTarget,
        Drafter,
        Engine,
        FeatureDrafter,
        FeatureTarget,
        Generation,
        SpecproofError,
        Stats,
        Step,
        StopReason,
        Target,
        UsageError,
        Violation,
        ViolationError,
        WhiteBoxTarget,
    )
    from specproof.engine import (
        DecodeSession,
        NgramDrafter,
        ReferenceConfig,
        ReferenceHybrid,
        SpecDecoder,
        greedy_decode,
    )
    from specproof.strategies import (
        RollbackMachine,
        ScriptedDrafter,
        SessionMachine,
        contexts,
        engine_greedy,
        round_plans,
        target_greedy,
    )
