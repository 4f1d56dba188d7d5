"""The driver protocol (docs/contract.md, "Drivers"): a new kind of search is a new driver plus its
registration, nothing else.

``ToyDriver`` below is such a driver, whole: it runs a trivial target invariant (``forward`` of n
tokens advances ``processed`` by n) registered in a test registry of one entry. Nothing in
``specproof`` changes for it: the check generator yields its check (the driver says where it
runs), the certification runs it, settles the verdict (pass, skip on nothing exercised, fail with
the violations) and builds the reproduce command, the same way as for the built-in drivers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import pytest

from specproof.conformance import (
    DRIVERS,
    REGISTRY,
    Certification,
    CheckItem,
    CheckResult,
    Driver,
    Invariant,
    Plan,
    register_driver,
)
from specproof.conformance._checks import generate_checks
from specproof.contract import ViolationError

CORRECT = "specproof.conformance.zoo:zoo_target"
BROKEN = "specproof.conformance.zoo:processed_is_last_index"  # processed is the last index, one short


# ---- the whole diff of a new driver: the module ... ------------------------------------------


class ToyDriver(Driver):
    """Forwards chunks of 1..3 tokens on a fresh target; each one must advance ``processed`` by its length."""

    name = "toy"

    @classmethod
    def checks(cls, invariant: Invariant, suite: object) -> Iterator[CheckItem]:
        if getattr(suite, "certify_target", False):
            yield CheckItem(invariant, "target")

    def run(self, item: CheckItem, result: CheckResult) -> None:
        target_subject = self.plan.suite.target
        assert target_subject is not None
        chunks = [] if item.invariant.id == "target.toy-nothing" else [[1], [2, 3], [4, 5, 6]]
        target = target_subject.make()
        for chunk in chunks:
            result.examples += 1
            before = int(target.processed)
            target.forward(chunk)
            result.exercised += 1
            if int(target.processed) != before + len(chunk):
                raise ViolationError(
                    [
                        item.invariant.violation(
                            f"forward of {len(chunk)} token(s) moved processed from {before} to {target.processed}",
                            expected=before + len(chunk),
                            actual=int(target.processed),
                            example={"chunk": chunk},
                        )
                    ]
                )
        if not result.exercised:
            result.skip("the toy driver forwarded nothing")

    def reproduce_args(self, result: CheckResult) -> Sequence[str]:
        return ("--toy-chunks", "1,2,3")


# ---- ... and its registration (plus the registry entries that name it) -----------------------


@pytest.fixture
def toy_driver() -> Iterator[type[Driver]]:
    register_driver(ToyDriver)
    try:
        yield ToyDriver
    finally:
        DRIVERS.pop(ToyDriver.name, None)


TOY = Invariant(
    id="target.toy-processed", subject="target", summary="forward advances processed", draws="chunks", driver="toy"
)
NOTHING = Invariant(id="target.toy-nothing", subject="target", summary="exercises nothing", draws="none", driver="toy")
TEST_REGISTRY = (TOY, NOTHING)


# ---- what the rest of specproof does with it, unchanged --------------------------------------


def _certify(spec: str) -> Certification:
    cert = Certification(Plan.create("target", target=spec), invariants=TEST_REGISTRY)
    for item in cert.all_checks():
        cert.run(item)
    return cert


def test_the_generator_yields_the_checks_the_new_driver_says(toy_driver: type[Driver]) -> None:
    plan = Plan.create("target", target=CORRECT)
    assert [i.id for i in generate_checks(plan, "target", invariants=TEST_REGISTRY)] == [TOY.id, NOTHING.id]
    assert list(generate_checks(plan, "engine", invariants=TEST_REGISTRY)) == []
    # an engine-only plan certifies no target: the driver yields nothing there
    assert list(generate_checks(Plan.create("drafter"), "target", invariants=TEST_REGISTRY)) == []


def test_a_correct_target_passes_with_what_it_exercised(toy_driver: type[Driver]) -> None:
    cert = _certify(CORRECT)
    result = cert.results[TOY.id]
    assert (result.status, result.examples, result.exercised) == ("pass", 3, 3)
    assert result.reproduce == ""


def test_nothing_exercised_is_a_skip_with_the_reason(toy_driver: type[Driver]) -> None:
    result = _certify(CORRECT).results[NOTHING.id]
    assert (result.status, result.detail) == ("skip", "the toy driver forwarded nothing")


def test_a_broken_target_fails_with_a_violation_and_a_reproduce_command(toy_driver: type[Driver]) -> None:
    cert = _certify(BROKEN)
    result = cert.results[TOY.id]
    assert result.status == "fail", result
    assert result.violations[0].invariant == TOY.id
    assert "moved processed" in result.detail
    # built in one place (_reproduce), with the driver's own options in it
    assert result.reproduce.startswith("specproof certify target --target ")
    assert f"--only {TOY.id} --toy-chunks 1,2,3" in result.reproduce


def test_an_expected_failure_applies_to_a_new_driver_too(toy_driver: type[Driver]) -> None:
    # (Plan.create validates --expect-fail ids against the project's registry: set it on the record)
    plan = attrs.evolve(Plan.create("target", target=BROKEN), expected_failures={TOY.id: "a known bug"})
    cert = Certification(plan, invariants=TEST_REGISTRY)
    (item,) = [i for i in cert.all_checks() if i.invariant is TOY]
    assert cert.run(item).status == "xfail"


def test_an_unregistered_driver_name_is_a_clear_error() -> None:
    plan = Plan.create("target", target=CORRECT)
    with pytest.raises(ValueError, match=r"no driver 'toy'.*registered drivers are \['batch-schedules', 'decode-"):
        list(generate_checks(plan, "target", invariants=TEST_REGISTRY))


def test_a_taken_name_cannot_be_registered_twice(toy_driver: type[Driver]) -> None:
    class Other(ToyDriver):
        pass

    with pytest.raises(ValueError, match="registered already"):
        register_driver(Other)


def test_every_registry_entry_names_a_registered_driver() -> None:
    assert {inv.driver for inv in REGISTRY} <= set(DRIVERS)
    assert set(DRIVERS) == {
        "examples",
        "engine-case",
        "rollback-machine",
        "session-machine",
        "sampling",
        "batch-schedules",
        "decode-state",
        "tree-cases",
        "tree-sampling",
    }
