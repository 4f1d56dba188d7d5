"""What a client may ask a sampling engine (capability ``sampling``; docs/protocol.md, Sampling): the
schemes a handshake offers, and the checks made before a sampled request goes out.
"""

from __future__ import annotations

from collections.abc import Mapping

from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampling import SAMPLING_SCHEMES
from specproof.engine.conventions import check_sampling_params

__all__ = ["check_sampling", "check_scheme", "offered_schemes"]


def offered_schemes(hello: Mapping[str, object], capabilities: frozenset[str]) -> tuple[str, ...]:
    """The handshake's ``sampling_schemes`` this client knows, the engine's default first (none without the
    capability ``sampling``; a newer engine's names are left out)."""
    if "sampling" not in capabilities:
        return ()
    listed = hello.get("sampling_schemes", ())
    return tuple(s for s in listed if s in SAMPLING_SCHEMES) if isinstance(listed, list) else ()


def check_scheme(value: str | None, offered: tuple[str, ...], label: str) -> str | None:
    """``value`` when requests may name it (None: the engine's default); else an ``InvalidSettingError``."""
    if value is not None and value not in offered:
        raise InvalidSettingError(
            f"engine {label}: scheme={value!r} is not one its handshake offers (sampling_schemes: "
            f"{', '.join(offered) or 'none'}; docs/protocol.md, Sampling)"
        )
    return value


def check_sampling(sampling: object, capabilities: frozenset[str], label: str) -> None:
    """Refuse, before anything is sent, ``sampling`` that is not a ``SamplingParams`` or None, or any
    sampling from an engine without the capability ``sampling``."""
    check_sampling_params(sampling)
    if sampling is None:
        return
    if "sampling" not in capabilities:
        raise InvalidSettingError(
            f"engine {label} does not declare the capability 'sampling' (its capabilities: "
            f"{', '.join(sorted(capabilities))}), so it cannot be asked to sample; nothing was sent "
            "(docs/protocol.md, Sampling)"
        )
