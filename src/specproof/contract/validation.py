"""The one place specproof checks an option's value: an integer with a lower bound, a tolerance.

Every check raises an ``InvalidSettingError`` (``contract.errors``; a ``ValueError``) naming
the option and its value — or, for a Hypothesis strategy's argument, the subclass the caller
passes as ``error`` (the strategies' ``StrategyArgumentError``, also Hypothesis' ``InvalidArgument``).
The messages read ``{where}: {name}={value!r} must be an integer >= {minimum}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any

from specproof.contract.errors import InvalidSettingError

__all__ = ["int_at_least", "int_at_least_validator", "validate_tolerance"]


def int_at_least(
    value: object,
    *,
    name: str,
    minimum: int,
    where: str | None = None,
    error: type[InvalidSettingError] = InvalidSettingError,
    hint: str = "",
) -> int:
    """``value`` as an ``int`` if it is an integer (numpy's too; never a bool) >= ``minimum``;
    else ``error`` naming ``where`` (the component or function), ``name`` and the value, then ``hint``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < minimum:
        prefix = f"{where}: " if where else ""
        raise error(f"{prefix}{name}={value!r} must be an integer >= {minimum}{hint}")
    return int(value)


def int_at_least_validator(minimum: int) -> Callable[[Any, Any, Any], None]:
    """``int_at_least`` as an attrs field validator: ``Class.field=value must be an integer >= minimum``."""

    def check(instance: Any, attribute: Any, value: Any) -> None:
        int_at_least(value, name=f"{type(instance).__name__}.{attribute.name}", minimum=minimum)

    return check


def validate_tolerance(value: object, *, name: str) -> float:
    """A tolerance is a finite real number >= 0; anything else is an ``InvalidSettingError`` (a
    ``ValueError``) naming it and its value.

    The one validator for every tolerance option (the CLI's, ``Plan.create``'s, the state machines').
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidSettingError(f"{name}={value!r} must be a finite number >= 0")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise InvalidSettingError(f"{name}={value!r} must be a finite number >= 0")
    return number
