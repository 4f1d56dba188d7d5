"""Certification profiles: how hard each invariant is searched.

``quick`` is for a developer's loop (the built-in stack in well under 15 s here),
``ci`` for a release gate (under 60 s), ``release`` for certifying a drafter or an
export before shipping. Every profile is derandomized unless a seed is given, so a
gate gives the same verdict on the same code.
"""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import ExampleDatabase

from specproof.contract.errors import InvalidSettingError

__all__ = ["PROFILES", "Profile", "get_profile"]


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    max_examples: int  # per invariant (engine examples are shared between invariants)
    capacity_examples: int  # filling a target to max_context is costly: a few suffice
    stateful_examples: int
    stateful_steps: int
    max_new_tokens: int  # upper bound of drawn generation lengths
    max_prompt: int
    # the longest context an example builds (a prompt ending near max_context): an engine that
    # declares a larger max_context is tested at this capacity, and the certificate says so
    max_capacity: int
    # the sampling checks (--sampling): the total-variation deviation each configuration's primary event
    # test must be able to detect (power 0.99), and the seeded generations each configuration draws (all
    # of them unless a test rejects: a run that stopped at the sensitivity would leave deviations just
    # under it to chance)
    sampling_tv: float
    sampling_generations: int
    # the most propose_sampled calls drafter.proposal-distribution makes (it stops at its sensitivity)
    sampling_proposals: int

    def hypothesis_settings(
        self, *, seed: int | None, max_examples: int | None = None, database: ExampleDatabase | None = None
    ) -> settings:
        # Hypothesis' derandomize=True implies database=None; with a database the caller seeds the
        # test with what derandomize would (the test function's digest): the same examples, plus reuse.
        return settings(
            max_examples=max_examples or self.max_examples,
            derandomize=seed is None and database is None,
            database=database,
            deadline=None,
            print_blob=False,
            report_multiple_bugs=False,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
                HealthCheck.function_scoped_fixture,
            ],
            stateful_step_count=self.stateful_steps,
        )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="quick",
            sampling_tv=0.2,
            sampling_generations=32,
            sampling_proposals=4800,
            max_examples=12,
            capacity_examples=1,
            stateful_examples=4,
            stateful_steps=10,
            max_new_tokens=24,
            max_prompt=40,
            max_capacity=4096,
        ),
        Profile(
            name="ci",
            sampling_tv=0.05,
            sampling_generations=240,
            sampling_proposals=60000,
            max_examples=40,
            capacity_examples=2,
            stateful_examples=8,
            stateful_steps=16,
            max_new_tokens=40,
            max_prompt=64,
            max_capacity=16384,
        ),
        Profile(
            name="release",
            sampling_tv=0.02,
            sampling_generations=1600,
            sampling_proposals=480000,
            max_examples=300,
            capacity_examples=6,
            stateful_examples=60,
            stateful_steps=40,
            max_new_tokens=64,
            max_prompt=160,
            max_capacity=65536,
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise InvalidSettingError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}") from None
