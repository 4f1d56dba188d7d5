"""Certifying tests: the target invariants of the registry (one pytest id per check)."""

from specproof.conformance.plugin import run_check


def test_target(specproof_certification, specproof_check):
    run_check(specproof_certification, specproof_check)
