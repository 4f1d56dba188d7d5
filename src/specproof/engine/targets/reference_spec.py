"""Target specs ``reference``, ``reference-moe`` and ``reference:FIELD=VALUE,...``."""

from __future__ import annotations

import attrs

from specproof.contract.errors import InvalidSettingError
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid, default_config, moe_config

__all__ = ["load", "load_moe", "parse_overrides"]


def parse_overrides(text: str, base: ReferenceConfig) -> ReferenceConfig:
    """Apply ``field=value,field=value`` overrides to ``base`` (``layers=conv+attn+gdn``)."""
    if not text:
        return base
    fields = {f.name: f for f in attrs.fields(ReferenceConfig)}
    changes: dict[str, object] = {}
    for item in text.split(","):
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq or name not in fields:
            known = ", ".join(sorted(fields))
            raise InvalidSettingError(f"unknown reference config override {item!r}; fields: {known}")
        current = getattr(base, name)
        try:
            if name == "layers":
                value: object = tuple(part.strip() for part in raw.split("+") if part.strip())
            elif isinstance(current, bool):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                value = raw.lower() in ("true", "1")
            elif isinstance(current, int):
                value = int(raw)
            elif isinstance(current, float):
                value = float(raw)
            else:
                value = raw
        except ValueError:
            raise InvalidSettingError(
                f"reference config {name}={raw!r} is not a valid {type(current).__name__}"
            ) from None
        changes[name] = value
    return attrs.evolve(base, **changes)  # type: ignore[misc, arg-type]


def load(args: str) -> ReferenceHybrid:
    return ReferenceHybrid(parse_overrides(args, default_config()))


def load_moe(args: str) -> ReferenceHybrid:
    return ReferenceHybrid(parse_overrides(args, moe_config()))
