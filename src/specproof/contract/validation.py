"""The one place specproof checks an option's value: an integer with a lower bound, a tolerance,
and a number given as text (``decimal_int``, ``decimal_number``: strict, as a person writes it).

Every check raises an ``InvalidSettingError`` (``contract.errors``; a ``ValueError``) naming
the option and its value — or, for a Hypothesis strategy's argument, the subclass the caller
passes as ``error`` (the strategies' ``StrategyArgumentError``, also Hypothesis' ``InvalidArgument``).
The messages read ``{where}: {name}={value!r} must be an integer >= {minimum}``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any

from specproof.contract.errors import InvalidSettingError

__all__ = [
    "INTEGER_TEXT",
    "NUMBER_TEXT",
    "decimal_int",
    "decimal_number",
    "integer_argument",
    "number_argument",
    "int_at_least",
    "int_at_least_validator",
    "validate_tolerance",
]

# Python's int() and float() read more than a person means: "1_0" is 10, "0x10" (int(x, 0)), "nan",
# "inf", "１０" (full-width digits). An option's number is plain decimal text, else refused.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
INTEGER_TEXT = "a decimal integer (digits, an optional sign; no underscores or other bases)"
NUMBER_TEXT = "a finite decimal number (e.g. 0.8 or 1e-3; no underscores, hex, nan or inf)"


def decimal_int(text: str) -> int:
    """``text`` (surrounding spaces aside) as an int if it is plain decimal digits with an optional
    sign; else an ``InvalidSettingError`` whose message is ``INTEGER_TEXT`` (the caller names the option)."""
    stripped = str(text).strip()
    if not _INTEGER.fullmatch(stripped):
        raise InvalidSettingError(INTEGER_TEXT)
    return int(stripped)


def decimal_number(text: str) -> float:
    """``text`` as a float if it is a plain decimal number (``0.8``, ``-1``, ``1e-3``) whose value is
    finite; else an ``InvalidSettingError`` whose message is ``NUMBER_TEXT``."""
    stripped = str(text).strip()
    if not _NUMBER.fullmatch(stripped) or not math.isfinite(number := float(stripped)):
        raise InvalidSettingError(NUMBER_TEXT)
    return number


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


def _argument(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type``: argparse (and pytest's option parser) print
    ``argument --seed: '1_0' must be a decimal integer (...)`` and exit 2."""
    import argparse

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except InvalidSettingError as err:
            raise argparse.ArgumentTypeError(f"{text!r} must be {err}") from None

    convert.__name__ = name
    return convert


integer_argument = _argument(decimal_int, "integer")
"""The ``type`` of every integer command-line option: ``decimal_int``, its refusal naming the option."""
number_argument = _argument(decimal_number, "number")
"""The ``type`` of every real-number command-line option: ``decimal_number``."""
