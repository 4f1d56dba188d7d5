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
