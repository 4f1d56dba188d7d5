"""The RollbackMachine's sampled round: a planted sampling bug is found, a correct sampler that
draws differently is accepted, and sampled rounds are actually run (docs/contract.md, "Sampling")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings

from _targets import small_target
from specproof.engine import _decoder
from specproof.strategies import RollbackMachineFailure, run_rollback_machine

SEARCH = settings(
    max_examples=60,
    stateful_step_count=12,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)


def _residual_from_p(draft, q, p, rng):  # type: ignore[no-untyped-def]
    """Rejection sampling whose replacement is drawn from p, not max(0, p - q): the rejected token can
    come back as its own replacement."""
    for i, token in enumerate(draft):
        if rng.random() * q[i, token] < p[i, token]:
            continue
        return i, int(rng.choice(len(p[i]), p=p[i]))
    return len(draft), int(rng.choice(len(p[len(draft)]), p=p[len(draft)]))


def _choice_sampler(draft, q, p, rng):  # type: ignore[no-untyped-def]
    """Correct, differently: the same rule, each draw by ``Generator.choice`` instead of an inverse CDF."""
    for i, token in enumerate(draft):
        if rng.random() * q[i, token] < p[i, token]:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        residual = residual / residual.sum() if residual.sum() > 0 else p[i]
        return i, int(rng.choice(len(residual), p=residual))
    return len(draft), int(rng.choice(len(p[len(draft)]), p=p[len(draft)]))


@pytest.mark.slow  # 60 machine examples, then the failure shrunk: tens of seconds
def test_a_replacement_drawn_from_p_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_decoder, "rejection_accept_tokens", _residual_from_p)
    with pytest.raises(RollbackMachineFailure) as info:
        run_rollback_machine(target_factory=small_target, settings=SEARCH)
    assert info.value.prop == "sampled"
    assert "after rule sampled_round(" in str(info.value)


def test_a_correct_sampler_that_draws_differently_passes_and_sampled_rounds_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_decoder, "rejection_accept_tokens", _choice_sampler)
    machine = run_rollback_machine(target_factory=small_target, settings=SEARCH)
    assert machine.observed_paths["round:sampled"] > 0
