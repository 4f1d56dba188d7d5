"""Speed: the cells of workload x target x rollback x k, timed against plain greedy decoding.

Each cell holds the counted figures (``_counting``), the verify-cost ratio, and the medians of
interleaved greedy/speculative chunk pairs, wall and thread-CPU (docs/bench.md, the figures).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from specproof.bench._config import BenchConfig
from specproof.bench._counting import (
    DecoderFactory,
    count_greedy,
    count_spec,
    degeneracy_figures,
    greedy_chunk,
    prefill,
)
from specproof.bench._protocol import BenchRun, ProgressHook
from specproof.bench._records import Cell
from specproof.bench._workloads import Workload, encode_text
from specproof.contract import Drafter, Target

__all__ = ["SpeedCells"]


@attrs.frozen
class SpeedCells:
    """The result's ``cells``: every target of the run (the bench target and its companions)."""

    def steps(self, config: BenchConfig) -> int:
        return len(config.targets) * len(config.workloads) * len(config.rollbacks) * len(config.ks)

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        cells: list[Cell] = []
        for spec in run.config.targets:
            cells.extend(
                _measure_target(
                    spec,
                    run.pair(spec),
                    run.workloads,
                    run.config,
                    drafter_factory=run.drafter_factory,
                    decoder_factory=run.decoder_factory,
                    tick=run.tick,
                )
            )
        return {"cells": tuple(cells)}


def _verify_cost_ratio(target: Target, snap: object, fed: list[int], rollback: str, reps: int) -> float:
    """(k+1)-token verify forward over one-token forward from one state: median of interleaved pair ratios."""
    verify = target.forward_with_checkpoints if rollback == "checkpoint" else target.forward  # type: ignore[attr-defined]
    ratios: list[float] = []
    for _ in range(reps):
        target.restore(snap)
        t0 = time.perf_counter()
        target.forward(fed[:1])
        one = time.perf_counter() - t0
        target.restore(snap)
        t0 = time.perf_counter()
        verify(fed)
        ratios.append((time.perf_counter() - t0) / one)
    return statistics.median(ratios)


def _measure_target(
    spec: str,
    targets: tuple[Target, Target],
    workloads: Sequence[Workload],
    config: BenchConfig,
    *,
    drafter_factory: Callable[[], Drafter],
    decoder_factory: DecoderFactory,
    tick: ProgressHook,
) -> list[Cell]:
    """The cells of one target spec. ``targets`` are two instances of it: the greedy
    side and the speculative side each keep their own state between timed chunks."""
    greedy_t, spec_t = targets
    cells: list[Cell] = []
    total = config.decode_tokens
    has_checkpoints = callable(getattr(spec_t, "forward_with_checkpoints", None))
    for wl in workloads:
        prompt = encode_text(spec_t, wl.text)
        oracle = count_greedy(greedy_t, prompt, total)
        for rollback in config.rollbacks:
            if rollback == "checkpoint" and not has_checkpoints:
                tick(f"{wl.name} {spec}: checkpoint needs forward_with_checkpoints, skipped")
                continue
            for k in config.ks:
                fig = count_spec(
                    spec_t,
                    prompt,
                    oracle,
                    k=k,
                    rollback=rollback,
                    chunks=config.chunks,
                    chunk_tokens=config.chunk_tokens,
                    drafter_factory=drafter_factory,
                    decoder_factory=decoder_factory,
                )
                # verify-cost ratio from the prefilled state, then both sides decode the same
                # positions chunk by chunk, alternating, so load on the machine hits both alike
                prefill(greedy_t, prompt)
                snap = greedy_t.snapshot()
                fed = [prompt[-1], *oracle.tokens[:k]]
                ratio = _verify_cost_ratio(greedy_t, snap, fed, rollback, config.verify_reps)
                greedy_t.restore(snap)
                session = decoder_factory(spec_t, drafter_factory(), k=k, rollback=rollback).start(prompt)
                pairs = _time_pairs(greedy_t, session, prompt[-1], chunks=config.chunks, tokens=config.chunk_tokens)
                cells.append(
                    _timed_cell(
                        spec, wl.name, rollback, k, prompt=prompt, fig=fig, ratio=ratio, pairs=pairs, oracle=oracle
                    )
                )
                tick(f"{wl.name} {spec} {rollback} k={k}")
    return cells


@attrs.frozen(kw_only=True)
class _Pairs:
    """Interleaved greedy/speculative chunks: tokens, wall and thread-CPU seconds, and per-pair ratios."""

    greedy_tokens: tuple[int, ...]
    spec_tokens: tuple[int, ...]
    greedy_seconds: tuple[float, ...]
    spec_seconds: tuple[float, ...]
    greedy_cpu: tuple[float, ...]
    spec_cpu: tuple[float, ...]

    @property
    def wall(self) -> list[float]:
        return [g / s for g, s in zip(self.greedy_seconds, self.spec_seconds)]

    @property
    def cpu(self) -> list[float]:
        return [g / s if s > 0 else 0.0 for g, s in zip(self.greedy_cpu, self.spec_cpu)]


def _time_pairs(greedy_t: Target, session: Any, pending: int, *, chunks: int, tokens: int) -> _Pairs:
    """Both sides decode the same positions chunk by chunk, alternating, so load hits both alike."""
    g_tokens: list[int] = []
    s_tokens: list[int] = []
    g_times: list[float] = []
    s_times: list[float] = []
    g_cpu: list[float] = []
    s_cpu: list[float] = []
    for _ in range(chunks):
        c0 = time.thread_time()
        tg, got = greedy_chunk(greedy_t, pending, tokens)
        c1 = time.thread_time()
        pending = got[-1]
        g_tokens.extend(got)
        t0 = time.perf_counter()
        gen = session.generate(tokens)
        ts = time.perf_counter() - t0
        c2 = time.thread_time()
        s_tokens.extend(gen.tokens)
        g_times.append(tg)
        s_times.append(ts)
        g_cpu.append(c1 - c0)
        s_cpu.append(c2 - c1)
    return _Pairs(
        greedy_tokens=tuple(g_tokens),
        spec_tokens=tuple(s_tokens),
        greedy_seconds=tuple(g_times),
        spec_seconds=tuple(s_times),
        greedy_cpu=tuple(g_cpu),
        spec_cpu=tuple(s_cpu),
    )


def _timed_cell(
    spec: str,
    workload: str,
    rollback: str,
    k: int,
    *,
    prompt: Sequence[int],
    fig: Mapping[str, Any],
    ratio: float,
    pairs: _Pairs,
    oracle: Any,
) -> Cell:
    """One cell: the counted figures, the verify-cost ratio and the medians of the timed pairs."""
    pair, cpu_pair = pairs.wall, pairs.cpu
    speedup = statistics.median(pair)
    cpu_speedup = statistics.median(cpu_pair)
    tpr = float(fig["tokens_per_round"])
    timed_equal = pairs.greedy_tokens == tuple(oracle.tokens) and pairs.spec_tokens == tuple(oracle.tokens)
    return Cell(
        workload=workload,
        target=spec,
        rollback=rollback,
        k=k,
        prompt_tokens=len(prompt),
        emitted=fig["emitted"],
        rounds=fig["rounds"],
        tokens_per_round=tpr,
        acceptance_by_position=fig["acceptance_by_position"],
        forwards_per_token=fig["forwards_per_token"],
        forwards_per_round=fig["forwards_per_round"],
        replay_per_round=fig["replay_per_round"],
        projected_speedup=fig["projected_speedup"],
        verify_bytes_ratio=fig["verify_bytes_ratio"],
        verify_cost_ratio=ratio,
        greedy_seconds=sum(pairs.greedy_seconds),
        spec_seconds=sum(pairs.spec_seconds),
        speedup=speedup,
        speedup_spread=(max(pair) - min(pair)) / speedup,
        cpu_speedup=cpu_speedup,
        greedy_cpu_seconds=sum(pairs.greedy_cpu),
        spec_cpu_seconds=sum(pairs.spec_cpu),
        cpu_speedup_spread=(max(cpu_pair) - min(cpu_pair)) / cpu_speedup if cpu_speedup else 0.0,
        efficiency=speedup / tpr if tpr else 0.0,
        lossless=timed_equal and bool(fig["lossless"]),
        **degeneracy_figures(oracle.tokens),
    )
