"""Certifying tests: the engine invariants of the registry (one pytest id per check)."""

from specproof.conformance.plugin import run_check


def test_engine(specproof_certification, specproof_check):
    run_check(specproof_certification, specproof_check)
