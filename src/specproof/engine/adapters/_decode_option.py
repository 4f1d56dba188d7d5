"""The adapters' ``decode=`` option (which decode features an engine declares, ``decode_features``), and
``refuse_unmapped``: a ``DecodeParams`` field an adapter does not pass through is refused, naming it.

``decode=penalties+min_tokens`` narrows what a ``vllm:`` or ``llamacpp:`` engine declares to those names, so
that a parameter the engine honours alone but refuses in a combination (vLLM: ``logit_bias`` with a
``repetition_penalty``) is judged on its own; the default is everything the adapter passes through.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from specproof.contract import DecodeParams
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError

__all__ = ["parse_decode_option", "refuse_unmapped"]


def refuse_unmapped(decode: DecodeParams, *, mapped: Collection[str], where: str) -> None:
    """``UnsupportedParameterError`` naming the first field of ``decode`` set away from its default that the
    adapter does not map (``mapped``): a field added to ``DecodeParams`` later is refused, never dropped."""
    default = DecodeParams()
    for field in attrs.fields(DecodeParams):
        if field.name not in mapped and getattr(decode, field.name) != getattr(default, field.name):
            raise UnsupportedParameterError(
                f"{where}: {field.name}={getattr(decode, field.name)!r} is not passed to the engine by this adapter"
            )


def parse_decode_option(value: str, *, supported: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``A+B+...`` -> the names, each among ``supported`` (``InvalidSettingError`` naming a bad one)."""
    names = [n.strip() for n in value.split("+")]
    for name in names:
        if name not in supported:
            raise InvalidSettingError(
                f"{where} option decode={value!r}: {name!r} is not a decode feature it passes through "
                f"({'+'.join(supported)})"
            )
    return tuple(n for n in supported if n in names)
