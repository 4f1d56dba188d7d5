"""What a client may ask an engine about decode-time state (docs/protocol.md, Decode state): the capabilities
that stand for ``DECODE_FEATURES`` and ``logprobs``, the refusal of a request that uses a feature the
engine does not declare (before anything is sent), and the ``generate`` fields that carry it.
"""

from __future__ import annotations

from typing import Any

import attrs

from specproof.contract import DECODE_FEATURES, DecodeParams
from specproof.contract.errors import InvalidSettingError

__all__ = [
    "LOGPROBS_CAPABILITY",
    "WIRE_DECODE_FEATURES",
    "DecodeAsk",
    "DecodeMethods",
    "PROCESSOR_STATE_CAPABILITY",
    "check_decode",
    "decode_fields",
    "declared_decode_features",
]

#: the capability that lets a ``generate`` ask for ``final.logprobs``
LOGPROBS_CAPABILITY = "logprobs"
#: the capability that lets a ``generate`` with ``decode`` ask for ``round.processor`` (white-box state)
PROCESSOR_STATE_CAPABILITY = "processor_state"


#: the ``DECODE_FEATURES`` that ``specproof-engine/1`` carries: all but the top-n alternatives of each
#: logprob (``final.logprobs`` holds the emitted token's only) and the prompt's logprobs, so a wire engine is
#: never judged on them
WIRE_DECODE_FEATURES: tuple[str, ...] = tuple(
    f for f in DECODE_FEATURES if f not in ("top_logprobs", "prompt_logprobs")
)


def declared_decode_features(capabilities: frozenset[str]) -> tuple[str, ...]:
    """The ``WIRE_DECODE_FEATURES`` an engine's handshake declares (each is a capability of the same name), in
    the contract's order; an engine that declares none takes no ``decode`` at all."""
    return tuple(f for f in WIRE_DECODE_FEATURES if f in capabilities)


def check_decode(decode: object, capabilities: frozenset[str], label: str) -> DecodeParams | None:
    """``decode`` when the engine may be sent it: None (nothing to send; an all-off ``DecodeParams`` too),
    or one whose every used feature the engine declares; an ``InvalidSettingError`` naming the missing
    capability otherwise, before anything is sent."""
    if decode is None:
        return None
    if not isinstance(decode, DecodeParams):
        raise InvalidSettingError(f"decode={decode!r} must be a DecodeParams or None")
    used = decode.features() | ({"stop_sequences"} if decode.eos_token_ids else set())
    missing = sorted(used - set(declared_decode_features(capabilities)))
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
        body = decode.to_json()
        # ``decode.logprobs`` travels as the top-level ``logprobs`` flag (its alternatives are refused above)
        logprobs = body.pop("logprobs", None) is not None or logprobs
        if body != DecodeParams().to_json():  # a request that only asks for logprobs sends no decode
            fields["decode"] = body
            if processor_state:
                fields["processor_state"] = True
    if logprobs:
        fields["logprobs"] = True
    return fields


class DecodeMethods:
    """``WireEngine``'s decode-state half: what the decode checks look for, and the ``generate`` fields of a
    request's ``DecodeParams``. ``generate(..., sampling=, decode=)`` samples with ``self.scheme`` (capability
    ``sampling``) and sends ``decode`` (a capability per feature it uses); either, without its capabilities,
    is an ``InvalidSettingError`` before anything is sent. ``decode_features`` is None and
    ``processor_states`` stays None without their capabilities, so the checks skip the engine saying why."""

    capabilities: frozenset[str]
    vocab_size: int
    #: the processor state after each round of the last generate (capability ``processor_state``, a request with
    #: decode parameters; None otherwise): what ``decode.processor-state`` judges
    processor_states: list[dict[str, Any]] | None = None
    _ask_logprobs: bool | None = None

    @property
    def label(self) -> str:  # WireEngine's: the engine's name and spec, for messages
        raise NotImplementedError

    @property
    def decode_features(self) -> tuple[str, ...] | None:
        """The ``DECODE_FEATURES`` the engine declares as capabilities; None when it declares none."""
        return declared_decode_features(self.capabilities) or None

    @property
    def ask_logprobs(self) -> bool:
        """Ask every generate for ``final.logprobs``: by default whenever the engine offers them (``logprobs``)."""
        offered = LOGPROBS_CAPABILITY in self.capabilities
        return offered if self._ask_logprobs is None else self._ask_logprobs and offered

    @ask_logprobs.setter
    def ask_logprobs(self, value: bool) -> None:
        self._ask_logprobs = bool(value)

    def _decode_ask(self, decode: object) -> DecodeAsk:
        """The ``generate`` fields for ``decode``, checked before anything is sent (``check_decode`` and the
        vocabulary), and ``processor_states`` renewed: a list the rounds fill when the engine reports them."""
        params = check_decode(decode, self.capabilities, self.label)
        if params is not None:
            params.check_vocab(self.vocab_size)
        white_box = params is not None and PROCESSOR_STATE_CAPABILITY in self.capabilities
        self.processor_states = [] if white_box else None
        fields = decode_fields(params, logprobs=self.ask_logprobs, processor_state=white_box)
        return DecodeAsk(fields=fields, processor_states=self.processor_states)


@attrs.frozen(kw_only=True)
class DecodeAsk:
    """What a ``generate`` carries for decode-time state, and where its rounds' processor states go."""

    fields: dict[str, object]
    processor_states: list[dict[str, Any]] | None
