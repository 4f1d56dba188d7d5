"""Certifying tests: target invariants (one pytest id per invariant and subject case)."""


def test_target(specproof_context, specproof_check, request):
    specproof_context.run(specproof_check, request.node.nodeid)
