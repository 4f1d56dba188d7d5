"""Decode benchmarks: plain greedy and speculative decoding per workload, one group per workload x target.

Compare rows within a group: ``greedy`` against ``spec-checkpoint`` and ``spec-replay``.
``extra_info`` carries tokens per round, acceptance by position, forwards per token and
the projected bandwidth-bound speedup (counted at the target, machine-independent).
"""

from __future__ import annotations

import numpy as np
import pytest

from specproof.bench import WORKLOAD_NAMES
from specproof.bench._counting import count_greedy, count_spec
from specproof.engine import NgramDrafter, SpecDecoder

K = 4


def _prefilled(target, prompt, n):
    target.reset()
    target.forward(prompt[:-1])
    return (target, prompt[-1], n), {}


def _greedy_steps(target, first, n):
    tok = first
    for _ in range(n):
        tok = int(np.argmax(target.forward([tok])[0]))
    return tok


@pytest.mark.parametrize("workload_name", WORKLOAD_NAMES)
def test_greedy(benchmark, prompt_of, max_new_tokens, target, target_spec, workload_name):
    prompt = prompt_of(workload_name)
    benchmark.group = f"decode {workload_name} {target_spec}"
    benchmark.name = "greedy"
    benchmark.extra_info.update({"workload": workload_name, "target": target_spec, "tokens": max_new_tokens})
    benchmark.pedantic(_greedy_steps, setup=lambda: _prefilled(target, prompt, max_new_tokens), rounds=3, iterations=1)


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize("workload_name", WORKLOAD_NAMES)
def test_speculative(benchmark, prompt_of, max_new_tokens, target, target_spec, workload_name, rollback):
    prompt = prompt_of(workload_name)
    greedy = count_greedy(target, prompt, max_new_tokens)
    fig = count_spec(target, prompt, greedy, k=K, rollback=rollback, chunks=1, chunk_tokens=max_new_tokens)
    assert fig["lossless"], f"{workload_name}/{target_spec}/{rollback}: speculative output differs from greedy"
    benchmark.group = f"decode {workload_name} {target_spec}"
    benchmark.name = f"spec-{rollback}"
    benchmark.extra_info.update(
        {
            "workload": workload_name,
            "target": target_spec,
            "rollback": rollback,
            "k": K,
            "tokens": max_new_tokens,
            "tokens_per_round": fig["tokens_per_round"],
            "acceptance_by_position": list(fig["acceptance_by_position"]),
            "forwards_per_token": fig["forwards_per_token"],
            "forwards_per_round": fig["forwards_per_round"],
            "replay_per_round": fig["replay_per_round"],
            "projected_speedup": fig["projected_speedup"],
            "verify_bytes_ratio": fig["verify_bytes_ratio"],
        }
    )

    def setup():
        session = SpecDecoder(target, NgramDrafter(), k=K, rollback=rollback).start(prompt)  # reset + prefill
        return (session,), {}

    benchmark.pedantic(lambda s: s.generate(max_new_tokens), setup=setup, rounds=3, iterations=1)
