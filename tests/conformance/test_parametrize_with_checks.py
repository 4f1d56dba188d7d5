"""A third party embeds specproof's checks in its own pytest suite (scikit-learn's parametrize_with_checks)."""

from __future__ import annotations

import pytest

from specproof.conformance import check, parametrize_with_checks
from specproof.contract import UsageError, ViolationError


@parametrize_with_checks(engine="specproof.conformance.zoo:zoo_engine", only=("engine.kv-length", "engine.lossless"))
def test_zoo_engine_passes(specproof_check: object) -> None:
    check(specproof_check)  # type: ignore[arg-type]


def test_a_broken_engine_fails_through_the_same_entry_point() -> None:
    spec = "specproof.conformance.zoo:processed_off_by_one"
    marker = parametrize_with_checks(engine=spec, only=("engine.kv-length",))
    ((specproof_check,),) = [p.values for p in marker.args[1]]
    with pytest.raises(ViolationError, match=r"engine\.kv-length"):
        check(specproof_check)


def test_options_are_validated_when_the_decorator_is_built() -> None:
    with pytest.raises(UsageError, match="nosuch"):
        parametrize_with_checks(engine="specproof.conformance.zoo:zoo_engine", only=("nosuch.id",))
