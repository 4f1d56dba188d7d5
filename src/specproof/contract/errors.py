"""Exceptions raised by the engine.

Every message names the component, the round (where there is one) and the
offending value, so a failure in a release gate is readable without a debugger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from specproof.contract._records import Generation

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
    "UnsupportedParameterError",
    "UsageError",
]


class SpecproofError(Exception):
    """Base class of every error specproof raises on purpose."""


class InvalidSettingError(SpecproofError, ValueError):
    """An option has a value it cannot take (``k < 0``, an unknown rollback strategy, ...)."""


class UnsupportedParameterError(InvalidSettingError):
    """An engine was given a decode parameter it cannot honour, and refuses the request naming it (the
    parameter-parity principle, docs/contract.md "Decode state": refuse, never ignore); the decode checks
    skip such a request with the message as their reason."""


class EmptyPromptError(SpecproofError, ValueError):
    """A generation was asked for with an empty prompt (there is no pending token)."""


class TokenRangeError(SpecproofError, ValueError):
    """A token id is not an integer in ``[0, vocab_size)``."""


class CapacityError(SpecproofError, ValueError):
    """A forward would take a target past its ``max_context``; nothing was changed."""


class PromptTooLongError(CapacityError):
    """The prompt does not fit in the target's context."""


class StaleSnapshotError(SpecproofError, ValueError):
    """A snapshot refers to KV slots that were overwritten after it was taken."""


class ContractError(SpecproofError):
    """A plugged-in component broke its protocol (see docs/contract.md, "Protocols and records")."""


class DrafterContractError(ContractError):
    """A drafter returned something the protocol does not allow."""


class TargetContractError(ContractError):
    """A target returned something the protocol does not allow."""


class DecodeError(SpecproofError):
    """A generation stopped part-way because a component raised.

    The target has been restored to its state before the failing round;
    ``partial`` holds every token emitted before it, so nothing is lost.
    The original exception is chained as ``__cause__``.
    """

    def __init__(self, message: str, *, partial: Generation, round_index: int) -> None:
        super().__init__(message)
        self.partial = partial
        self.round_index = round_index


class UsageError(SpecproofError, ValueError):
    """Bad input from the user (an option, a path, a spec, a file): the CLI prints it on one line and exits 2.

    Raised before any long work starts, so nothing is half-written.
    """


class PluginError(UsageError):
    """A ``module:attribute`` plug-in or a target spec could not be resolved (a usage error)."""


class MissingDependencyError(SpecproofError, ImportError):
    """An optional extra is not installed; the message says which ``pip install`` fixes it."""
