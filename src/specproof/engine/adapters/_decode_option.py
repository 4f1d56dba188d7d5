"""The adapters' ``decode=`` option: which decode features an engine declares (``decode_features``).

``decode=penalties+min_tokens`` narrows what a ``vllm:`` or ``llamacpp:`` engine declares to those names, so
that a parameter the engine honours alone but refuses in a combination (vLLM: ``logit_bias`` with a
``repetition_penalty``) is judged on its own; the default is everything the adapter passes through.
"""

from __future__ import annotations

from specproof.contract.errors import InvalidSettingError

__all__ = ["parse_decode_option"]


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
