"""specproof.conformance: the invariants, certifying test modules, pytest plugin, reports and traces."""
