"""specproof.engine: protocols, records, the speculative decoder, the greedy oracle,
drafters and targets (command-line specs resolve in ``specproof.plugins``).

This module is the public facade; the implementation lives in private modules.
"""

from specproof.contract import (
    STOP_REASONS,
    CheckpointingTarget,
    Drafter,
    Engine,
    FeatureDrafter,
    FeatureTarget,
    Generation,
    Stats,
    Step,
    StopReason,
    Target,
    WhiteBoxTarget,
)
from specproof.contract.errors import (
    CapacityError,
    ContractError,
    DecodeError,
    DrafterContractError,
    EmptyPromptError,
    InvalidSettingError,
    MissingDependencyError,
    PluginError,
    PromptTooLongError,
    SpecproofError,
    StaleSnapshotError,
    TargetContractError,
    TokenRangeError,
)
from specproof.engine._batch_decoder import BatchSpecDecoder
from specproof.engine._decoder import (
    ROLLBACK_STRATEGIES,
    ContextView,
    DecodeSession,
    SpecDecoder,
    longest_accepted_prefix,
)
from specproof.engine._grammar import EngineGrammar
from specproof.engine._greedy import greedy_decode, greedy_with_margins, top2_margin
from specproof.engine._processors import RequestProcessors
from specproof.engine._router_margins import row_router_margins
from specproof.engine._tree_decoder import TreeRound, TreeSpecDecoder
from specproof.engine.drafters import CombinedDrafter, ModelDrafter, NgramDrafter
from specproof.engine.targets import register_target_family
from specproof.engine.targets._reference_batch import BatchForward, ReferenceSlotPool, SwappedSlot
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid, ReferenceSnapshot

__all__ = [
    "ROLLBACK_STRATEGIES",
    "STOP_REASONS",
    "BatchForward",
    "BatchSpecDecoder",
    "TreeRound",
    "TreeSpecDecoder",
    "CapacityError",
    "CheckpointingTarget",
    "CombinedDrafter",
    "ContextView",
    "ContractError",
    "DecodeError",
    "DecodeSession",
    "Drafter",
    "DrafterContractError",
    "EmptyPromptError",
    "Engine",
    "EngineGrammar",
    "FeatureDrafter",
    "FeatureTarget",
    "Generation",
    "InvalidSettingError",
    "MissingDependencyError",
    "ModelDrafter",
    "NgramDrafter",
    "PluginError",
    "PromptTooLongError",
    "ReferenceConfig",
    "ReferenceHybrid",
    "ReferenceSlotPool",
    "ReferenceSnapshot",
    "RequestProcessors",
    "SpecDecoder",
    "SpecproofError",
    "StaleSnapshotError",
    "Stats",
    "Step",
    "StopReason",
    "SwappedSlot",
    "Target",
    "TargetContractError",
    "TokenRangeError",
    "WhiteBoxTarget",
    "greedy_decode",
    "greedy_with_margins",
    "row_router_margins",
    "longest_accepted_prefix",
    "register_target_family",
    "top2_margin",
]
