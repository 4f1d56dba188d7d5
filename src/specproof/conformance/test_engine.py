"""Certifying tests: engine invariants (one pytest id per invariant and subject case)."""


def test_engine(specproof_context, specproof_check, request):
    specproof_context.run(specproof_check, request.node.nodeid)
