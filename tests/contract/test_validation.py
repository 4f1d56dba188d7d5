"""The one validation module (``specproof.contract.validation``): integer lower bounds and
tolerances, one exception family (``InvalidSettingError``), used everywhere."""

from __future__ import annotations

import pathlib
import re

import attrs
import numpy as np
import pytest
from hypothesis.errors import InvalidArgument

import specproof
from specproof.contract.errors import InvalidSettingError
from specproof.contract.validation import int_at_least, int_at_least_validator, validate_tolerance
from specproof.strategies import contexts
from specproof.strategies._contexts import StrategyArgumentError

SRC = pathlib.Path(specproof.__file__).parent


@pytest.mark.parametrize("value", [0, 3, np.int64(2), np.uint8(1)])
def test_int_at_least_accepts_integers_at_or_above_the_bound(value: object) -> None:
    got = int_at_least(value, name="k", minimum=0)
    assert got == int(value) and type(got) is int  # type: ignore[call-overload]


@pytest.mark.parametrize("value", [-1, True, 1.0, "1", None, np.float64(2.0)])
def test_int_at_least_rejects_anything_else_naming_it(value: object) -> None:
    with pytest.raises(InvalidSettingError, match=re.escape(f"f(): k={value!r} must be an integer >= 0")):
        int_at_least(value, name="k", minimum=0, where="f()")


def test_the_attrs_validator_names_the_class_and_field() -> None:
    @attrs.frozen
    class Box:
        n: int = attrs.field(validator=int_at_least_validator(1))

    assert Box(1).n == 1
    with pytest.raises(InvalidSettingError, match=r"^Box\.n=0 must be an integer >= 1$"):
        Box(0)


def test_a_strategy_argument_error_is_both_families() -> None:
    """Hypothesis' convention (InvalidArgument) and specproof's (InvalidSettingError) at once."""
    with pytest.raises(StrategyArgumentError) as info:
        contexts(vocab_size=0)
    assert isinstance(info.value, InvalidArgument) and isinstance(info.value, InvalidSettingError)
    assert str(info.value) == "contexts(): vocab_size=0 must be an integer >= 1"


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), True, "0", None])
def test_validate_tolerance_rejects_non_finite_negative_and_non_numbers(bad: object) -> None:
    with pytest.raises(InvalidSettingError, match=r"--atol=.* must be a finite number >= 0"):
        validate_tolerance(bad, name="--atol")
    assert validate_tolerance(np.float32(0.5), name="--atol") == 0.5


def test_no_other_module_writes_its_own_lower_bound_check() -> None:
    """The generic message (a bound held in a variable) is written in one place only."""
    generic = re.compile(r"must be an integer >= \{(minimum|low|min_value)\}")
    found = [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py")) if generic.search(p.read_text())]
    assert found == ["contract/validation.py"], found
