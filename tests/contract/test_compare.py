"""The one comparison policy (specproof.contract.compare): exact or within atol; NaN and signed zero."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specproof.contract import arrays_differ, states_differ, validate_tolerance


def test_exact_treats_signed_zeros_as_equal_and_nan_as_equal_to_nan() -> None:
    assert arrays_differ(np.array([0.0, np.nan]), np.array([-0.0, np.nan]), atol=0.0) is None


def test_exact_rejects_the_last_bit() -> None:
    a = np.array([1.0], dtype=np.float32)
    b = np.nextafter(a, np.float32(2.0))
    why = arrays_differ(a, b, atol=0.0, name="conv_state")
    assert why is not None and why.startswith("conv_state differs at (0,)")


def test_nan_against_a_number_differs_at_any_atol() -> None:
    assert arrays_differ(np.array([np.nan]), np.array([1.0]), atol=1e9) is not None


def test_infinities_must_match_in_sign() -> None:
    assert arrays_differ(np.array([np.inf]), np.array([np.inf]), atol=1e-3) is None
    assert arrays_differ(np.array([np.inf]), np.array([-np.inf]), atol=1e-3) is not None


def test_atol_is_absolute_not_relative() -> None:
    assert arrays_differ(np.array([1e-7]), np.array([2e-7]), atol=1e-6) is None
    assert arrays_differ(np.array([1000.0]), np.array([1000.01]), atol=1e-3) is not None


def test_shapes_and_state_names_must_match() -> None:
    assert "shape" in (arrays_differ(np.zeros(2), np.zeros(3), atol=0.0) or "")
    assert "state names" in (states_differ({"a": np.zeros(1)}, {"b": np.zeros(1)}, atol=0.0) or "")


def test_every_differing_state_array_is_named() -> None:
    why = states_differ({"a": np.zeros(1), "b": np.zeros(1)}, {"a": np.ones(1), "b": np.ones(1)}, atol=0.0)
    assert why is not None and "a differs" in why and "b differs" in why


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "x", None])
def test_tolerances_are_finite_and_non_negative(bad: object) -> None:
    with pytest.raises(ValueError, match="tol"):
        validate_tolerance(bad, name="--atol")


def test_the_rollback_machine_and_the_checks_share_the_policy() -> None:
    """One target cannot pass engine.state-restored in certify and fail it in the stateful check."""
    from specproof.conformance.checks.target import compare_states
    from specproof.strategies._machine import _compare_arrays

    want = {"s": np.array([0.0, np.nan])}
    got = {"s": np.array([-0.0, np.nan])}
    assert compare_states(want, got, tolerance=0.0) is None
    assert _compare_arrays("s", got["s"], want["s"], 0.0) is None
