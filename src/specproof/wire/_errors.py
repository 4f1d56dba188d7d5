"""Errors of the wire client (subclasses of ``specproof.engine.SpecproofError``)."""

from __future__ import annotations

from specproof.engine import SpecproofError

__all__ = ["EngineProtocolError", "EngineRequestError"]


class EngineProtocolError(SpecproofError):
    """An external engine broke ``specproof-engine/1``: invalid JSON, a schema violation, an
    unexpected message, an exit mid-request or no answer within the timeout.

    The message names the engine, the request, the last message received and the engine's
    stderr tail; ``stderr_tail`` holds the latter separately for reports.
    """

    def __init__(self, message: str, *, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.stderr_tail = stderr_tail


class EngineRequestError(SpecproofError):
    """The engine answered a request with an ``error`` message (it stays usable)."""
