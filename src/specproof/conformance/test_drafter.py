"""Certifying tests: drafter invariants (one pytest id per invariant)."""


def test_drafter(specproof_context, specproof_check, request):
    specproof_context.run(specproof_check, request.node.nodeid)
