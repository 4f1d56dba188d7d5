"""Hypothesis profiles for the project's own tests.

``dev`` (the default) is quick; ``ci`` is derandomized so CI is deterministic.
Select with HYPOTHESIS_PROFILE (tox and .ci/run set ``ci``).
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# `specproof certify` keeps an example database under Hypothesis' directory by default: the tests'
# CLI runs get one of their own for the session, never the user's cache.
if "SPECPROOF_HYPOTHESIS_DIR" not in os.environ:
    import tempfile

    os.environ["SPECPROOF_HYPOTHESIS_DIR"] = os.path.join(tempfile.mkdtemp(prefix="specproof-tests-"), "hypothesis")
