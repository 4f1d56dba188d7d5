"""Verify-cost benchmarks: a one-token forward vs a (k+1)-token verify forward from the same state.

One group per target; the ratio of the ``verify-k*`` rows to ``one-token`` is the
verify-cost ratio ``specproof bench`` reports (1.0 on a bandwidth-bound device).
"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("q", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("method", ["forward", "forward_with_checkpoints"])
def test_forward(benchmark, prompt_of, target, target_spec, q, method):
    if method == "forward_with_checkpoints" and not callable(getattr(target, method, None)):
        pytest.skip(f"{target_spec} has no forward_with_checkpoints")
    if method == "forward_with_checkpoints" and q == 1:
        pytest.skip("a one-token verify is the plain forward row")
    prompt = prompt_of("code-edit")
    target.reset()
    target.forward(prompt[:-1])
    snap = target.snapshot()
    fed = prompt[-q:]
    fn = getattr(target, method)
    benchmark.group = f"verify-cost {target_spec}"
    benchmark.name = "one-token" if q == 1 else f"verify-k{q - 1} ({method})"
    benchmark.extra_info.update({"target": target_spec, "tokens": q, "method": method, "context": len(prompt) - 1})
    benchmark.pedantic(fn, args=(fed,), setup=lambda: target.restore(snap), rounds=25, iterations=1)
