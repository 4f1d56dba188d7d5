"""Batches: the batched reference decoder beside the single-request engine, at each of ``config.batch_sizes``.

At batch size B, B requests (the workloads' prompts in turn, each a few tokens shorter than the
last request on the same workload, so no two are alike) of ``config.batch_tokens`` new tokens each
are decoded together by ``BatchSpecDecoder`` over a ``ReferenceSlotPool`` of B slots (``run_batch``),
and one after another by the single-request engine (the run's ``decoder_factory``), both with a
fresh drafter per request from the run's ``drafter_factory``, at the run's first k, checkpoint rollback.

Counted, the same on every machine (gated by default): tokens per round (emitted over each request's
rounds) and verify forwards per token (batched verify steps over the tokens of every request; the
single engine's is one forward a round). Timed, reported only: tokens per second by the wall clock
and by the process' CPU time (numpy's threads count), of both sides, prefill included on both.
``lossless``: every request's batched tokens equal its solo run's.

The reference pool computes each row of a step as that slot's own forward (which is what keeps it
exactly batch-invariant), so batching saves no target work here: its throughput shows the
scheduler's cost per request, not a device's batching gain.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from specproof.bench._config import BenchConfig, first_k
from specproof.bench._protocol import BenchRun
from specproof.bench._workloads import encode_text
from specproof.contract import BatchRequest, Generation, Target, run_batch
from specproof.engine import BatchSpecDecoder, ReferenceSlotPool
from specproof.engine.targets.reference import ReferenceHybrid

__all__ = ["BatchFigures"]

_STAGGER = 8  # tokens cut from a prompt each time a workload comes round again


@attrs.frozen
class BatchFigures:
    """The result's ``batches``: one cell per batch size, on the bench target."""

    def steps(self, config: BenchConfig) -> int:
        return len(config.batch_sizes)

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        config = run.config
        if not config.batch_sizes:
            return {"batches": {"status": "skip", "reason": "no batch sizes asked for (batch_sizes is empty)"}}
        target = run.pair(config.target)[0]
        if not isinstance(target, ReferenceHybrid):
            reason = f"the batched reference decoder needs a reference-family target, not {config.target!r}"
            return {"batches": {"status": "skip", "reason": reason}}
        k = first_k(config)
        requests = _requests(run, target, max(config.batch_sizes))
        solo = _solo_runs(run, target, requests, k=k)
        cells = []
        for size in config.batch_sizes:
            cells.append(_cell(run, target, requests[:size], solo[:size], k=k))
            run.tick(f"batch of {size}")
        return {
            "batches": {
                "status": "ok",
                "method": "B requests decoded together by BatchSpecDecoder over a ReferenceSlotPool of B slots, "
                "and one after another by the single-request engine; the pool computes each row as its slot's "
                "own forward, so the throughput ratio is the scheduler's cost, not a batching gain",
                "target": config.target,
                "k": k,
                "rollback": "checkpoint",
                "tokens": config.batch_tokens,
                "cells": cells,
            }
        }


@attrs.frozen(kw_only=True)
class _Solo:
    """One request run alone on the single-request engine."""

    generation: Generation
    seconds: float
    cpu_seconds: float


def _requests(run: BenchRun, target: Target, count: int) -> list[BatchRequest]:
    prompts = [encode_text(target, wl.text) for wl in run.workloads]
    out = []
    for j in range(count):
        prompt = prompts[j % len(prompts)]
        cut = min(_STAGGER * (j // len(prompts)), len(prompt) - 1)
        out.append(
            BatchRequest(
                request_id=f"request-{j}",
                prompt=prompt[: len(prompt) - cut],
                max_new_tokens=run.config.batch_tokens,
                drafter=run.drafter_factory(),
            )
        )
    return out


def _solo_runs(run: BenchRun, target: Target, requests: Sequence[BatchRequest], *, k: int) -> list[_Solo]:
    out = []
    for request in requests:
        session = run.decoder_factory(target, run.drafter_factory(), k=k, rollback="checkpoint")
        t0, c0 = time.perf_counter(), time.process_time()
        generation = session.start(list(request.prompt)).generate(request.max_new_tokens)
        out.append(_Solo(generation=generation, seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0))
    return out


class _CountedPool(ReferenceSlotPool):
    """A slot pool that counts its batched verify forwards (one per scheduler step that verifies)."""

    def __init__(self, target: ReferenceHybrid, *, slots: int) -> None:
        super().__init__(target, slots=slots)
        self.verify_steps = 0

    def forward_batch(self, rows: Any, *, checkpoints: bool) -> Any:
        self.verify_steps += 1
        return super().forward_batch(rows, checkpoints=checkpoints)


def _cell(
    run: BenchRun, target: ReferenceHybrid, requests: Sequence[BatchRequest], solo: Sequence[_Solo], *, k: int
) -> dict[str, Any]:
    size = len(requests)
    pool = _CountedPool(target, slots=size)
    engine = BatchSpecDecoder(pool, run.drafter_factory(), k=k, rollback="checkpoint", max_batch=size)
    t0, c0 = time.perf_counter(), time.process_time()
    # every round commits at least one token of every running request: this many steps always suffice
    done = run_batch(engine, requests, max_steps=run.config.batch_tokens + 2 + size)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    generations = [done[r.request_id] for r in requests]
    emitted = sum(len(g.tokens) for g in generations)
    rounds = sum(g.stats.rounds for g in generations if g.stats is not None)
    solo_emitted = sum(len(s.generation.tokens) for s in solo)
    solo_stats = [s.generation.stats for s in solo if s.generation.stats is not None]
    solo_rounds = sum(st.rounds for st in solo_stats)
    solo_forwards = sum(st.verify_forwards + st.replay_forwards for st in solo_stats)
    solo_seconds = sum(s.seconds for s in solo)
    solo_cpu = sum(s.cpu_seconds for s in solo)
    tokens_per_second = emitted / seconds if seconds > 0 else 0.0
    solo_per_second = solo_emitted / solo_seconds if solo_seconds > 0 else 0.0
    return {
        "key": f"{run.config.target}/b{size}",
        "batch": size,
        "emitted": emitted,
        "rounds": rounds,
        "verify_steps": pool.verify_steps,
        "tokens_per_round": emitted / max(rounds, 1),
        "forwards_per_token": pool.verify_steps / max(emitted, 1),
        "rows_per_step": rounds / max(pool.verify_steps, 1),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "tokens_per_second": tokens_per_second,
        "cpu_tokens_per_second": emitted / cpu_seconds if cpu_seconds > 0 else 0.0,
        "single": {
            "emitted": solo_emitted,
            "rounds": solo_rounds,
            "tokens_per_round": solo_emitted / max(solo_rounds, 1),
            "forwards_per_token": solo_forwards / max(solo_emitted, 1),
            "seconds": solo_seconds,
            "cpu_seconds": solo_cpu,
            "tokens_per_second": solo_per_second,
            "cpu_tokens_per_second": solo_emitted / solo_cpu if solo_cpu > 0 else 0.0,
        },
        "throughput_ratio": tokens_per_second / solo_per_second if solo_per_second > 0 else 0.0,
        "lossless": all(tuple(g.tokens) == tuple(s.generation.tokens) for g, s in zip(generations, solo)),
    }
