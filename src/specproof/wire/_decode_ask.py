"""What a client may ask an engine about decode-time state (docs/protocol.md, Decode state): the capabilities
that stand for ``DECODE_FEATURES`` and ``logprobs``, the refusal of a request that uses a feature the
engine does not declare (before anything is sent), and the ``generate`` fields that carry it.
"""

from __future__ import annotations

from specproof.contract import DECODE_FEATURES, DecodeParams
from specproof.contract.errors import InvalidSettingError

__all__ = [
    "LOGPROBS_CAPABILITY",
    "PROCESSOR_STATE_CAPABILITY",
    "check_decode",
    "decode_fields",
    "declared_decode_features",
]

#: the capability that lets a ``generate`` ask for ``final.logprobs``
LOGPROBS_CAPABILITY = "logprobs"
#: the capability that lets a ``generate`` with ``decode`` ask for ``round.processor`` (white-box state)
PROCESSOR_STATE_CAPABILITY = "processor_state"


def declared_decode_features(capabilities: frozenset[str]) -> tuple[str, ...]:
    """The ``DECODE_FEATURES`` an engine's handshake declares (each is a capability of the same name), in the
    contract's order; an engine that declares none takes no ``decode`` at all."""
    return tuple(f for f in DECODE_FEATURES if f in capabilities)


def check_decode(decode: object, capabilities: frozenset[str], label: str) -> DecodeParams | None:
    """``decode`` when the engine may be sent it: None (nothing to send; an all-off ``DecodeParams`` too),
    or one whose every used feature the engine declares; an ``InvalidSettingError`` naming the missing
    capability otherwise, before anything is sent."""
    if decode is None:
        return None
    if not isinstance(decode, DecodeParams):
        raise InvalidSettingError(f"decode={decode!r} must be a DecodeParams or None")
    used = decode.features() | ({"stop_sequences"} if decode.eos_token_ids else set())
    missing = sorted(used - capabilities)
    if missing:
        raise InvalidSettingError(
            f"engine {label} does not declare the capabilit{'y' if len(missing) == 1 else 'ies'} "
            f"{', '.join(map(repr, missing))} this request's decode parameters use (its capabilities: "
            f"{', '.join(sorted(capabilities))}); nothing was sent (docs/protocol.md, Decode state)"
        )
    return decode if used else None


def decode_fields(decode: DecodeParams | None, *, logprobs: bool, processor_state: bool = False) -> dict[str, object]:
    """The ``generate`` fields for ``decode`` (and, with it, a request for the per-round processor state) and a
    logprobs request: none for a request without either, so an engine without the capabilities gets the
    message it always got."""
    fields: dict[str, object] = {}
    if decode is not None:
        fields["decode"] = decode.to_json()
        if processor_state:
            fields["processor_state"] = True
    if logprobs:
        fields["logprobs"] = True
    return fields
