"""Fixtures of the pytest-benchmark suites (``pytest benchmarks/``).

The suites time the same things ``specproof bench`` measures, on the same workloads
(CPython standard-library text, see ``specproof.bench._workloads``), and attach the
machine-independent figures to each benchmark's ``extra_info`` so a saved
pytest-benchmark JSON carries them beside the timings.

``SPECPROOF_BENCH_TARGET`` picks the dense target (default: the bench's default);
the MoE reference target is always measured beside a reference-family one.
"""

from __future__ import annotations

import os

import pytest

from specproof.bench import DEFAULT_TARGET, MOE_COMPANION, Workload, build_workloads, encode_text
from specproof.contract import Target
from specproof.plugins import load_target

BENCH_TARGET = os.environ.get("SPECPROOF_BENCH_TARGET", DEFAULT_TARGET)
TARGETS = tuple(
    dict.fromkeys((BENCH_TARGET, MOE_COMPANION) if BENCH_TARGET.startswith("reference") else (BENCH_TARGET,))
)
PROMPT_CHARS = 800
MAX_NEW_TOKENS = 64


@pytest.fixture(scope="session")
def workloads() -> dict[str, Workload]:
    return {w.name: w for w in build_workloads(prompt_chars=PROMPT_CHARS)}


_TARGETS: dict[str, Target] = {}


@pytest.fixture(params=TARGETS)
def target_spec(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(target_spec: str) -> Target:
    # one instance per spec for the whole session: building the reference weights is not what is timed
    if target_spec not in _TARGETS:
        _TARGETS[target_spec] = load_target(target_spec)
    return _TARGETS[target_spec]


@pytest.fixture
def max_new_tokens() -> int:
    return MAX_NEW_TOKENS


@pytest.fixture
def prompt_of(target: Target, workloads: dict[str, Workload]):  # type: ignore[no-untyped-def]
    """``prompt_of(name)``: the workload's prompt as token ids for the current target."""
    return lambda name: encode_text(target, workloads[name].text)
