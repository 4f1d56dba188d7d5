"""The opt-in drivers' one preamble (``drivers/_protocol.py``): a driver declares the plan options its checks
run only with (``options``), the certification skips each of its checks naming the first one not given (the
reason is the option's own, ``_options.OPTIONS``), and a ``NotApplicable`` raised in ``run`` (no subject of
the driver's kind, a missing capability) is a skip with its reason, never a pass nor an error.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import pytest

from specproof.conformance import (
    DRIVERS,
    Certification,
    CheckItem,
    CheckResult,
    Driver,
    Invariant,
    Plan,
    certify,
    register_driver,
)
from specproof.conformance import _options as options
from specproof.conformance._records import Capabilities
from specproof.conformance.drivers import NotApplicable, require

TARGET = "specproof.conformance.zoo:zoo_target"
OPT_IN = {"batches", "decode_state", "trees", "sampling"}


class OptInToy(Driver):
    """Runs only with --trees and --sampling; raises what its invariant's id says."""

    name = "opt-in-toy"
    options = ("trees", "sampling")

    @classmethod
    def checks(cls, invariant: Invariant, suite: object) -> Iterator[CheckItem]:
        yield CheckItem(invariant, "target")

    def run(self, item: CheckItem, result: CheckResult) -> None:
        if item.invariant.id == "target.toy-no-subject":
            raise NotApplicable("the toy has no subject here")
        if item.invariant.id == "target.toy-lacks":
            require(item.invariant, Capabilities(has=set(), why_not={"toy_cap": "the toy lacks toy_cap"}))
        if item.invariant.id == "target.toy-breaks":
            raise RuntimeError("a bug in the driver")
        result.examples += 1
        result.exercised += 1


def _toy(id: str, **needs: object) -> Invariant:
    return Invariant(id=id, subject="target", summary="toy", draws="none", driver="opt-in-toy", **needs)


RUNS = _toy("target.toy-runs")
NO_SUBJECT = _toy("target.toy-no-subject")
LACKS = _toy("target.toy-lacks", needs=("toy_cap",))
BREAKS = _toy("target.toy-breaks")


@pytest.fixture
def toy() -> Iterator[None]:
    register_driver(OptInToy)
    try:
        yield
    finally:
        DRIVERS.pop(OptInToy.name, None)


def _results(**plan: object) -> dict[str, CheckResult]:
    cert = Certification(Plan.create("target", target=TARGET, **plan), invariants=(RUNS, NO_SUBJECT, LACKS, BREAKS))
    return {item.invariant.id: cert.run(item) for item in cert.all_checks()}


def test_every_declared_option_is_a_plan_option_with_its_own_skip_reason() -> None:
    declared = {dest for driver in DRIVERS.values() for dest in driver.options}
    assert declared == OPT_IN
    plan_fields = {f.name for f in attrs.fields(Plan)}
    for dest in declared:
        option = options.get(dest)
        assert dest in plan_fields and option.plan and option.skip_without, dest
        assert option.cli in option.not_given() and "{flag}" not in option.not_given()


@pytest.mark.parametrize(
    ("plan", "missing"),
    [({}, "trees"), ({"sampling": "temperature=1"}, "trees"), ({"trees": True}, "sampling")],
)
def test_a_missing_option_skips_every_check_naming_the_first_one_missing(
    toy: None, plan: dict[str, object], missing: str
) -> None:
    results = _results(**plan)
    assert {(r.status, r.detail) for r in results.values()} == {("skip", options.get(missing).not_given())}
    assert all(r.examples == 0 for r in results.values())  # run() never started


def test_with_the_options_given_the_check_runs_and_not_applicable_is_a_skip_with_its_reason(toy: None) -> None:
    results = _results(trees=True, sampling="temperature=1")
    assert (results[RUNS.id].status, results[RUNS.id].exercised) == ("pass", 1)
    assert (results[NO_SUBJECT.id].status, results[NO_SUBJECT.id].detail) == ("skip", "the toy has no subject here")
    assert results[LACKS.id].status == "skip" and "the toy lacks toy_cap" in results[LACKS.id].detail
    # any other exception stays the check's error, as before
    assert (results[BREAKS.id].status, results[BREAKS.id].detail) == ("error", "RuntimeError: a bug in the driver")


def test_the_real_option_messages_name_the_flag_and_the_section() -> None:
    batches = "batches were not asked for: give --batches (docs/contract.md, Batches)"
    assert options.get("batches").not_given() == batches
    assert options.get("sampling").not_given().startswith("sampled decoding was not asked for: give --sampling temp")
    assert options.get("seed").not_given() == "seed was not asked for: give --seed"  # no words of its own


@pytest.mark.parametrize(
    ("only", "missing", "given"),
    [
        ("batch.isolation", "batches", {}),
        ("tree.greedy-lossless", "trees", {}),
        ("decode.min-tokens", "decode_state", {}),
        ("engine.sampled-distribution", "sampling", {}),
        ("tree.sampled-distribution", "sampling", {"trees": True}),
    ],
)
def test_the_built_in_opt_in_drivers_skip_with_the_options_reason(
    only: str, missing: str, given: dict[str, object]
) -> None:
    report = certify("all", only=(only,), **given).to_json()  # type: ignore[arg-type]
    assert report["results"], only
    for row in report["results"]:
        assert (row["status"], row["detail"]) == ("skip", options.get(missing).not_given()), row
