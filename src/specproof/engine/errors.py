"""Re-export: the errors live in the bottom layer, ``specproof.contract.errors``."""

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
    UsageError,
)

__all__ = [
    "CapacityError",
    "ContractError",
    "DecodeError",
    "DrafterContractError",
    "EmptyPromptError",
    "InvalidSettingError",
    "MissingDependencyError",
    "PluginError",
    "PromptTooLongError",
    "SpecproofError",
    "StaleSnapshotError",
    "TargetContractError",
    "TokenRangeError",
    "UsageError",
]
