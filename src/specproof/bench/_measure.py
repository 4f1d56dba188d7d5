"""The benchmark figures: what ``specproof bench`` measures and how.

Per workload x target x rollback strategy x k (one *cell*):

- ``tokens_per_round``, ``acceptance_by_position``: from the engine's ``Stats``;
- ``forwards_per_token`` / ``forwards_per_round`` / ``replay_per_round``: target
  forwards after prefill (verify + replay) counted *at the target* by a wrapper, so an
  engine that does work it does not report is still charged for it;
- ``projected_speedup``: the bandwidth-bound projection, greedy weight bytes over
  speculative weight bytes for the same emitted tokens. A forward reads the dense
  weights once plus, on a mixture-of-experts target, every expert any position of
  that forward routed to (``parameter_bytes()`` and ``last_experts_touched``); a
  target without ``parameter_bytes`` counts one unit per forward, which is the
  dense figure ``emitted / (verify + replay)``;
- ``verify_cost_ratio``: time of the (k+1)-token verify forward the strategy uses
  over a one-token forward, from the same prefilled state, interleaved: the median
  of the pair ratios;
- ``speedup``: plain greedy decode time over speculative decode time, measured in
  this process, interleaved: two instances of the target (one per side) are
  prefilled once, then the cell's ``chunks * chunk_tokens`` tokens are decoded chunk
  by chunk, greedy chunk then speculative chunk (the same positions, since the
  output is lossless); the figure is the median of the per-chunk time ratios, so a
  burst of load from elsewhere spoils one pair, not the figure;
- ``cpu_speedup``: the same chunk pairs timed in the decoding thread's CPU time
  (``time.thread_time``) instead of the wall clock: time the process spends descheduled
  by other jobs on a shared machine does not count, so the ratio is steady enough to
  gate at 10 % (docs/bench.md, the gate);
- ``efficiency``: ``speedup / tokens_per_round``;
- ``lossless``: the speculative tokens equal the greedy oracle's.

**Drafter comparison** (``drafter_cells``): on the bench target, each drafter of
``BenchConfig.drafters`` (prompt lookup, the ``trained-small`` draft model, the two
combined) on every workload at k = 4 (or the run's first k): tokens per round, acceptance by position,
draft-model forwards per round, the median wall time of a proposal over that of a one-token
target step, and the projected speedup that charges every draft-model forward its weight
bytes (``draft bytes / target bytes`` per forward, counted at the draft model).

**Peers**: the same model decoded by the peer and by specproof's engine, ``peer_tokens``
tokens each, after one warm-up run of both, ``peer_repeats`` pairs alternating which goes
first, torch on one thread; the median tokens/s ratio and its spread over the pairs, with
the load average before and after.

**Degeneracy** (every cell and drafter cell): the greedy continuation's distinct 4-gram share and
its final period (``_degeneracy``); a continuation with a share below 0.5 is *degenerate*: marked,
and left out of the headline figures (the gate's means over workloads).

**Real contexts** (``real_contexts``): every drafter judged teacher-forced on held-out text
(``_real``): the figure drafters are compared on. The drafter cells above are free-running.
Beside the greedy figure, ``real_contexts.sampled``: the same positions at each of
``real_temperatures`` (0.7 and 1.0), each drafter proposing by sampling and the target accepting
by rejection sampling, ``real_seeds`` fixed seeds per position (``_sampled``); reported, not gated.

Beside the cells: the drafter's cost per proposal at 1K/8K/64K tokens of context
(incremental, as the engine uses it), ``specproof certify --profile ci`` wall time,
and peer engines on the same model when their extras are installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import numpy as np

from specproof._version import __version__
from specproof.bench._degeneracy import distinct_ngram_share, final_period, is_degenerate
from specproof.bench._real import RealContextCell, measure_real_contexts, real_context_texts
from specproof.bench._sampled import SAMPLED_SEED, SAMPLED_TEMPERATURES, measure_sampled_contexts
from specproof.bench._workloads import WORKLOAD_NAMES, Workload, build_workloads, encode_text, stdlib_token_stream
from specproof.contract import Drafter, Target
from specproof.contract.errors import InvalidSettingError, SpecproofError
from specproof.engine import ContextView, NgramDrafter, SpecDecoder, greedy_decode
from specproof.engine.drafters import CombinedDrafter, ModelDrafter
from specproof.formats import bench as bench_format
from specproof.plugins import drafter_factory as spec_factory
from specproof.plugins import load_drafter, load_target

__all__ = [
    "DEFAULT_TARGET",
    "MOE_COMPANION",
    "BenchConfig",
    "BenchResult",
    "Cell",
    "CountingTarget",
    "DRAFTER_COMPARISON",
    "DecoderFactory",
    "DrafterCell",
    "OPTIONAL_DRAFTERS",
    "RealContextCell",
    "resolve_drafters",
    "comparison_drafter",
    "degeneracy_label",
    "drafter_table_lines",
    "real_context_lines",
    "sampled_context_lines",
    "peer_lines",
    "GreedyCount",
    "count_greedy",
    "count_spec",
    "plan_size",
    "platform_info",
    "run_bench",
]

# The target the bench measures unless told otherwise (a later issue switches it to "trained").
DEFAULT_TARGET: Final = "trained"
# Reported beside any reference-family target: the verify-reads-more-experts case.
MOE_COMPANION: Final = "reference-moe"
# The drafters compared on every workload (the bench target only): prompt lookup, the
# trained fixture's small draft model, and prompt lookup falling back to that model.
DRAFTER_COMPARISON: Final = ("ngram", "model:trained-small", "combined:trained-small")
# Compared too when their specs resolve in this checkout (feature heads and suffix lookup).
OPTIONAL_DRAFTERS: Final = ("eagle:trained", "mtp:trained", "suffix")

DecoderFactory = Callable[..., Any]  # (target, drafter, *, k, rollback) -> an object with start(prompt)
ProgressHook = Callable[[str], None]


def _check_ints(name: str, values: Sequence[int], minimum: int) -> tuple[int, ...]:
    out = tuple(values)
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in out):
        raise InvalidSettingError(f"BenchConfig.{name}={values!r} must be a non-empty list of integers >= {minimum}")
    return out


@attrs.frozen(kw_only=True)
class BenchConfig:
    """What one bench run measures. ``quick()`` and ``full()`` are the two presets the CLI offers."""

    mode: str
    target: str = DEFAULT_TARGET
    companions: tuple[str, ...] = (MOE_COMPANION,)
    workloads: tuple[str, ...] = WORKLOAD_NAMES
    ks: tuple[int, ...] = (4,)
    rollbacks: tuple[str, ...] = ("checkpoint", "replay")
    prompt_chars: int = 800
    chunk_tokens: int = 16
    chunks: int = 12
    verify_reps: int = 15
    drafter_contexts: tuple[int, ...] = (1024, 8192, 65536)
    drafter_reps: int = 200
    certify: bool = False
    drafters: tuple[str, ...] = DRAFTER_COMPARISON
    peers: bool = True
    peer_tokens: int = 128  # tokens per engine per pair (at least 64: shorter runs are mostly noise here)
    peer_repeats: int = 9  # alternating pairs after one warm-up of each engine (at least 7)
    optional_drafters: bool = True  # add OPTIONAL_DRAFTERS that resolve to the comparison
    real_files: int = 4  # held-out test-suite files for the real-context acceptance (0: not measured)
    real_tokens: int = 1024  # tokens of each file drafted from
    real_stride: int = 32  # a position every this many tokens ...
    real_min_prefix: int = 128  # ... from this one
    real_temperatures: tuple[float, ...] = SAMPLED_TEMPERATURES  # sampled real contexts (empty: not measured)
    real_seeds: int = 2  # seeded rejection-sampling rounds per position, drafter and temperature

    def __attrs_post_init__(self) -> None:
        _check_ints("ks", self.ks, 1)
        _check_ints("drafter_contexts", self.drafter_contexts, 16)
        for name in ("chunk_tokens", "chunks", "verify_reps", "drafter_reps", "peer_tokens", "peer_repeats"):
            _check_ints(name, [getattr(self, name)], 1)
        _check_ints("real_files", [self.real_files], 0)
        for name in ("real_tokens", "real_stride", "real_min_prefix", "real_seeds"):
            _check_ints(name, [getattr(self, name)], 1)
        for t in self.real_temperatures:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 100:
                raise InvalidSettingError(
                    f"BenchConfig.real_temperatures={list(self.real_temperatures)!r}: each must be a number in (0, 100]"
                )
        if self.real_min_prefix >= self.real_tokens:
            raise InvalidSettingError(
                f"BenchConfig.real_min_prefix={self.real_min_prefix} must be below real_tokens={self.real_tokens}"
            )
        for r in self.rollbacks:
            if r not in ("checkpoint", "replay"):
                raise InvalidSettingError(f"BenchConfig.rollbacks: {r!r} is not 'checkpoint' or 'replay'")
        for w in self.workloads:
            if w not in WORKLOAD_NAMES:
                known = ", ".join(WORKLOAD_NAMES)
                raise InvalidSettingError(f"BenchConfig.workloads: {w!r} is unknown; known: {known}")

    @classmethod
    def quick(cls, *, target: str = DEFAULT_TARGET) -> BenchConfig:
        """The CI preset: k=4 only, 12 interleaved chunks of 16 tokens per cell."""
        return cls(mode="quick", target=target, companions=_companions(target))

    @classmethod
    def full(cls, *, target: str = DEFAULT_TARGET) -> BenchConfig:
        """The README preset: k in 1, 2, 4, 8, 16 chunks of 16 tokens per cell, longer prompts, certify wall time."""
        return cls(
            mode="full",
            target=target,
            companions=_companions(target),
            ks=(1, 2, 4, 8),
            prompt_chars=1200,
            chunks=16,
            verify_reps=25,
            drafter_reps=400,
            certify=True,
            peer_tokens=128,
            peer_repeats=15,
            real_files=8,
            real_tokens=2048,
            real_stride=24,
            real_seeds=4,
        )

    @property
    def decode_tokens(self) -> int:
        """Tokens each cell decodes after its prompt: ``chunks * chunk_tokens``."""
        return self.chunks * self.chunk_tokens

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.target, *self.companions)))

    def to_json(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(self).items()}


def _companions(target: str) -> tuple[str, ...]:
    return (MOE_COMPANION,) if target.split(":", 1)[0] == "reference" else ()


# --------------------------------------------------------------------------- counting


class CountingTarget:
    """Wraps a target and records, per forward, its length and the weight bytes it read.

    Bytes: ``parameter_bytes()['dense']`` plus ``per_expert`` for every expert of every
    MoE layer in ``last_experts_touched`` after that forward; without
    ``parameter_bytes`` every forward counts as 1 (dense units).
    """

    def __init__(self, inner: Target) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.max_context = inner.max_context
        self.name = f"counting({getattr(inner, 'name', type(inner).__name__)})"
        pb = getattr(inner, "parameter_bytes", None)
        info: Mapping[str, int] | None = pb() if callable(pb) else None
        self._dense = float(info["dense"]) if info else 1.0
        self._per_expert = float(info.get("per_expert", 0)) if info else 0.0
        self.log: list[tuple[int, float]] = []  # (tokens in the forward, bytes read)
        if callable(getattr(inner, "forward_with_checkpoints", None)):
            self.forward_with_checkpoints = self._forward_with_checkpoints

    @property
    def processed(self) -> int:
        return self.inner.processed

    def _bytes(self) -> float:
        touched = getattr(self.inner, "last_experts_touched", ())
        return self._dense + self._per_expert * sum(len(s) for s in touched)

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        out = self.inner.forward(tokens)
        self.log.append((len(tokens), self._bytes()))
        return out

    def _forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[np.ndarray, list[object]]:
        out = self.inner.forward_with_checkpoints(tokens)  # type: ignore[attr-defined]
        self.log.append((len(tokens), self._bytes()))
        return out  # type: ignore[no-any-return]

    def snapshot(self) -> object:
        return self.inner.snapshot()

    def restore(self, snapshot: object) -> None:
        self.inner.restore(snapshot)

    def reset(self) -> None:
        self.inner.reset()

    def decode_log(self, prompt_len: int) -> list[tuple[int, float]]:
        """The forwards after prefill (the first forward is prefill when the prompt has > 1 token)."""
        return self.log[1:] if prompt_len > 1 else list(self.log)


# --------------------------------------------------------------------------- records


@attrs.frozen(kw_only=True)
class Cell:
    """The figures of one workload x target x rollback x k."""

    workload: str
    target: str
    rollback: str
    k: int
    prompt_tokens: int
    emitted: int
    rounds: int
    tokens_per_round: float
    acceptance_by_position: tuple[float, ...]
    forwards_per_token: float
    forwards_per_round: float
    replay_per_round: float
    projected_speedup: float
    verify_bytes_ratio: float  # bytes of a verify forward over a one-token greedy forward (1.0 on dense)
    verify_cost_ratio: float
    greedy_seconds: float  # total timed decode seconds, informational only (never gated)
    spec_seconds: float
    speedup: float
    speedup_spread: float  # (max - min) / median of the per-pair ratios of this run
    cpu_speedup: float  # the same pairs timed in this thread's CPU time: blind to time spent descheduled
    cpu_speedup_spread: float
    greedy_cpu_seconds: float  # informational, never gated
    spec_cpu_seconds: float
    efficiency: float
    lossless: bool
    distinct_4gram_share: float  # of the greedy continuation decoded (docs/bench.md, degeneracy)
    final_period: int | None
    degenerate: bool

    @property
    def key(self) -> str:
        return f"{self.workload}/{self.target}/{self.rollback}/k{self.k}"

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = attrs.asdict(self)
        data["acceptance_by_position"] = list(self.acceptance_by_position)
        data["key"] = self.key
        return data


@attrs.frozen(kw_only=True)
class DrafterCell:
    """One drafter on one workload (the bench target, the first k, one rollback strategy)."""

    workload: str
    target: str
    drafter: str
    rollback: str
    k: int
    emitted: int
    rounds: int
    tokens_per_round: float
    acceptance_by_position: tuple[float, ...]
    draft_forwards_per_round: float  # draft-model forwards per round (0 for prompt lookup)
    draft_bytes_ratio: float  # weight bytes of one draft-model forward over one target step (0 without a model)
    projected_speedup: float  # greedy bytes / (target bytes + draft-model bytes) for the same tokens
    projected_speedup_target_only: float  # the same, not charging the draft model (the cells' figure)
    proposal_seconds: float  # median wall time of one propose call (informational)
    target_step_seconds: float  # median wall time of one one-token target forward (informational)
    proposal_cost: float  # proposal_seconds / target_step_seconds
    lossless: bool
    distinct_4gram_share: float
    final_period: int | None
    degenerate: bool

    @property
    def key(self) -> str:
        return f"{self.workload}/{self.target}/{self.drafter}/k{self.k}"

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = attrs.asdict(self)
        data["acceptance_by_position"] = list(self.acceptance_by_position)
        data["key"] = self.key
        return data


@attrs.frozen(kw_only=True)
class BenchResult:
    """Everything one run measured, plus where and with what it ran."""

    config: BenchConfig
    cells: tuple[Cell, ...]
    drafter_cells: tuple[DrafterCell, ...]
    workloads: tuple[Workload, ...]
    drafter: Mapping[str, Any]
    certify: Mapping[str, Any]
    peers: tuple[Mapping[str, Any], ...]
    platform: Mapping[str, str]
    seconds: float
    real_contexts: Mapping[str, Any] = attrs.field(factory=dict)
    drafters_skipped: tuple[Mapping[str, str], ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "schema": bench_format.ID,
            "version": __version__,
            "platform": dict(self.platform),
            "config": self.config.to_json(),
            "workloads": [w.to_json() for w in self.workloads],
            "cells": [c.to_json() for c in self.cells],
            "drafter_cells": [c.to_json() for c in self.drafter_cells],
            "drafters_skipped": [dict(d) for d in self.drafters_skipped],
            "real_contexts": dict(self.real_contexts),
            "drafter": dict(self.drafter),
            "certify": dict(self.certify),
            "peers": [dict(p) for p in self.peers],
            "seconds": self.seconds,
        }


def platform_info() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "system": platform.system(),
        "processor": platform.processor() or "unknown",
        "cpus": str(os.cpu_count()),
        # when, and how busy the machine was: the wall-clock figures depend on it (docs/bench.md)
        "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown",
    }


# --------------------------------------------------------------------------- timing


def _prefill(target: Target, prompt: list[int]) -> None:
    target.reset()
    if len(prompt) > 1:
        target.forward(prompt[:-1])


def _greedy_chunk(target: Target, pending: int, n: int) -> tuple[float, list[int]]:
    """Time ``n`` plain greedy steps from the target's state: the leanest loop, no bookkeeping."""
    tok = pending
    out: list[int] = []
    forward = target.forward
    argmax = np.argmax
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(argmax(forward([tok])[0]))
        out.append(tok)
    return time.perf_counter() - t0, out


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


def _drafter_cost(
    drafter_factory: Callable[[], Drafter], contexts: Sequence[int], *, k: int, reps: int, append: int = 4
) -> dict[str, Any]:
    """Median seconds per proposal after appending ``append`` tokens to an already-indexed context.

    One drafter per context length, all indexed first (untimed: the engine pays that
    once per conversation), then timed round-robin so machine drift hits every length alike.
    """
    stream = stdlib_token_stream(max(contexts) + reps * append)
    states: list[tuple[int, Drafter, list[int], ContextView, list[float]]] = []
    for n in contexts:
        drafter = drafter_factory()
        reset = getattr(drafter, "reset", None)
        if callable(reset):
            reset()
        buf = list(stream[:n])
        view = ContextView(buf)  # the engine hands the same growing view every round
        drafter.propose(view, k)
        states.append((n, drafter, buf, view, []))
    for r in range(reps):
        for n, drafter, buf, view, times in states:
            buf.extend(stream[n + r * append : n + (r + 1) * append])
            t0 = time.perf_counter()
            drafter.propose(view, k)
            times.append(time.perf_counter() - t0)
    secs = {str(n): statistics.median(times) for n, _, _, _, times in states}
    lo, hi = str(min(contexts)), str(max(contexts))
    return {
        "k": k,
        "append": append,
        "reps": reps,
        "seconds": secs,
        "scaling": secs[hi] / secs[lo] if secs[lo] > 0 else float("inf"),
        "scaling_contexts": [int(lo), int(hi)],
    }


def _certify_wall(timeout: float = 1800.0) -> dict[str, Any]:
    if importlib.util.find_spec("specproof._cli.certify") is None:
        return {"status": "skip", "reason": "specproof certify is not in this checkout"}
    cmd = [sys.executable, "-m", "specproof", "certify", "--profile", "ci", "--json"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": time.perf_counter() - t0, "reason": f"over {timeout:.0f} s"}
    return {
        "status": "pass" if proc.returncode == 0 else "fail",
        "exit_code": proc.returncode,
        "seconds": time.perf_counter() - t0,
        "command": "specproof certify --profile ci",
    }


@attrs.frozen(kw_only=True)
class GreedyCount:
    """The greedy oracle's tokens and the weight bytes its decode forwards read."""

    tokens: tuple[int, ...]
    decode_bytes: float
    one_token_bytes: float


def count_greedy(target: Target, prompt: list[int], n: int) -> GreedyCount:
    """Run the greedy oracle on a counting wrapper of ``target``."""
    counting = CountingTarget(target)
    oracle = greedy_decode(counting, prompt, n)  # type: ignore[arg-type]
    log = counting.decode_log(len(prompt))
    total = sum(b for _, b in log)
    return GreedyCount(tokens=oracle.tokens, decode_bytes=total, one_token_bytes=total / len(log) if log else 1.0)


def count_spec(
    target: Target,
    prompt: list[int],
    greedy: GreedyCount,
    *,
    k: int,
    rollback: str,
    chunks: int,
    chunk_tokens: int,
    drafter_factory: Callable[[], Drafter] = NgramDrafter,
    decoder_factory: DecoderFactory | None = None,
) -> dict[str, Any]:
    """The machine-independent figures of one speculative conversation, counted at the target.

    The conversation is decoded as the timed runs decode it: ``chunks`` calls of
    ``session.generate(chunk_tokens)`` on one session.
    """
    counting = CountingTarget(target)
    make = decoder_factory or _default_decoder
    session = make(counting, drafter_factory(), k=k, rollback=rollback).start(prompt)
    tokens: list[int] = []
    rounds = replay = 0
    attempts = [0] * k
    accepts = [0] * k
    for i in range(chunks):
        gen = session.generate(chunk_tokens)
        stats = gen.stats
        if stats is None:
            raise SpecproofError(
                f"bench: the engine (k={k}, rollback={rollback}) returned a Generation without stats in chunk {i}"
            )
        tokens.extend(gen.tokens)
        rounds += stats.rounds
        replay += stats.replay_forwards
        for p, (n_att, n_acc) in enumerate(zip(stats.position_attempts, stats.position_accepts)):
            if p < k:
                attempts[p] += n_att
                accepts[p] += n_acc
    log = counting.decode_log(len(prompt))
    emitted = max(len(tokens), 1)
    n_rounds = max(rounds, 1)
    spec_bytes = sum(b for _, b in log)
    verify_bytes = [b for q, b in log if q > 1]
    return {
        "tokens": tuple(tokens),
        "emitted": len(tokens),
        "rounds": rounds,
        "tokens_per_round": len(tokens) / n_rounds,
        "acceptance_by_position": tuple(a / n if n else 0.0 for a, n in zip(accepts, attempts)),
        "forwards_per_token": len(log) / emitted,
        "forwards_per_round": len(log) / n_rounds,
        "replay_per_round": replay / n_rounds,
        "projected_speedup": greedy.decode_bytes / spec_bytes if spec_bytes else 0.0,
        "spec_bytes": spec_bytes,
        "verify_bytes_ratio": statistics.mean(verify_bytes) / greedy.one_token_bytes if verify_bytes else 1.0,
        "lossless": tuple(tokens) == greedy.tokens,
    }


# --------------------------------------------------------------------------- cells


def _degeneracy(tokens: Sequence[int]) -> dict[str, Any]:
    return {
        "distinct_4gram_share": distinct_ngram_share(tokens, 4),
        "final_period": final_period(tokens),
        "degenerate": is_degenerate(tokens),
    }


def _default_decoder(target: Target, drafter: Drafter, *, k: int, rollback: str) -> SpecDecoder:
    return SpecDecoder(target, drafter, k=k, rollback=rollback)  # type: ignore[arg-type]


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
                _prefill(greedy_t, prompt)
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
        tg, got = _greedy_chunk(greedy_t, pending, tokens)
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
        **_degeneracy(oracle.tokens),
    )


# --------------------------------------------------------------------------- drafter comparison


class _TimedDrafter:
    """Times every ``propose`` of the drafter it wraps (and passes ``reset`` through)."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.times: list[float] = []

    def reset(self) -> None:
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    def propose(self, context: Sequence[int], k: int) -> Sequence[int]:
        t0 = time.perf_counter()
        out = self.inner.propose(context, k)
        self.times.append(time.perf_counter() - t0)
        return out


def comparison_drafter(spec: str) -> tuple[Drafter, CountingTarget | None]:
    """The drafter a spec names; for ``model:`` / ``combined:`` specs, with its draft model wrapped in a
    ``CountingTarget`` (returned too) so its forwards and the bytes they read are counted."""
    prefix, _, rest = spec.partition(":")
    if prefix in ("model", "combined"):
        model = CountingTarget(load_target(rest))
        drafter = ModelDrafter(model, name=f"ModelDrafter({rest})")  # type: ignore[arg-type]
        return (drafter if prefix == "model" else CombinedDrafter(drafter)), model
    return load_drafter(spec), None


def resolve_drafters(config: BenchConfig) -> tuple[tuple[str, ...], tuple[dict[str, str], ...]]:
    """The drafter specs a run compares: ``config.drafters`` (a spec that does not resolve is a usage error),
    then each of ``OPTIONAL_DRAFTERS`` that resolves here (the others listed as skipped, with the reason)."""
    for spec in config.drafters:
        spec_factory(spec)
    specs = list(config.drafters)
    skipped: list[dict[str, str]] = []
    if config.optional_drafters and config.drafters:
        for spec in OPTIONAL_DRAFTERS:
            if spec in specs:
                continue
            try:
                spec_factory(spec)
            except SpecproofError as exc:
                skipped.append({"drafter": spec, "reason": str(exc)})
            else:
                specs.append(spec)
    return tuple(specs), tuple(skipped)


def _measure_drafters(
    spec: str,
    target: Target,
    workloads: Sequence[Workload],
    config: BenchConfig,
    *,
    drafters: Sequence[str],
    decoder_factory: DecoderFactory,
    tick: ProgressHook,
) -> list[DrafterCell]:
    """The drafter comparison on one target: every drafter of ``config.drafters`` on every workload (k = 4 when
    the run has it, else its first k)."""
    k = 4 if 4 in config.ks else config.ks[0]
    rollback = "checkpoint" if callable(getattr(target, "forward_with_checkpoints", None)) else "replay"
    pb = getattr(target, "parameter_bytes", None)
    target_bytes = float(pb()["dense"]) if callable(pb) else 1.0
    out: list[DrafterCell] = []
    for wl in workloads:
        prompt = encode_text(target, wl.text)
        oracle = count_greedy(target, prompt, config.decode_tokens)
        degeneracy = _degeneracy(oracle.tokens)
        # the wall time of a one-token target step, from the prompt's state
        _prefill(target, prompt)
        step_times: list[float] = []
        pending = prompt[-1]
        for _ in range(4):
            t, got = _greedy_chunk(target, pending, 8)
            pending = got[-1]
            step_times.append(t / 8)
        step = statistics.median(step_times)
        for dspec in drafters:
            inner, model = comparison_drafter(dspec)
            timed = _TimedDrafter(inner)
            fig = count_spec(
                target,
                prompt,
                oracle,
                k=k,
                rollback=rollback,
                chunks=config.chunks,
                chunk_tokens=config.chunk_tokens,
                drafter_factory=lambda timed=timed: timed,  # type: ignore[misc]
                decoder_factory=decoder_factory,
            )
            rounds = max(int(fig["rounds"]), 1)
            # the draft model's prefill of the prompt is not charged, as the target's is not
            draft_log = model.log[1:] if model is not None else []
            draft_bytes = sum(b for _, b in draft_log)
            draft_one = model._dense if model is not None else 0.0
            spec_bytes = float(fig["spec_bytes"])
            proposal = statistics.median(timed.times) if timed.times else 0.0
            out.append(
                DrafterCell(
                    workload=wl.name,
                    target=spec,
                    drafter=dspec,
                    rollback=rollback,
                    k=k,
                    emitted=fig["emitted"],
                    rounds=fig["rounds"],
                    tokens_per_round=float(fig["tokens_per_round"]),
                    acceptance_by_position=fig["acceptance_by_position"],
                    draft_forwards_per_round=len(draft_log) / rounds,
                    draft_bytes_ratio=draft_one / target_bytes,
                    projected_speedup=oracle.decode_bytes / (spec_bytes + draft_bytes) if spec_bytes else 0.0,
                    projected_speedup_target_only=float(fig["projected_speedup"]),
                    proposal_seconds=proposal,
                    target_step_seconds=step,
                    proposal_cost=proposal / step if step > 0 else 0.0,
                    lossless=bool(fig["lossless"]),
                    **degeneracy,
                )
            )
            tick(f"{wl.name} {spec} drafter {dspec}")
    return out


def drafter_table_lines(result: Mapping[str, Any]) -> list[str]:
    """The drafter comparison of a bench result (``BenchResult.to_json()``) as plain text lines."""
    cells = result.get("drafter_cells") or []
    if not cells:
        return []
    k = cells[0]["k"]
    lines = [
        f"drafters on {cells[0]['target']}, free-running (k={k}, {cells[0]['rollback']}): tok/round | accepted by "
        "position | draft fwd/round | proposal / target step (wall) | projected (draft bytes counted) | target-only | "
        "lossless | continuation: distinct 4-gram share, final period"
    ]
    for c in cells:
        acc = " ".join(f"{a:.2f}" for a in c["acceptance_by_position"])
        lines.append(
            f"  {c['workload']:<13} {c['drafter']:<24} {c['tokens_per_round']:5.2f} | {acc} | "
            f"{c['draft_forwards_per_round']:4.2f} | {c['proposal_cost']:6.2f}x | {c['projected_speedup']:5.2f}x | "
            f"{c['projected_speedup_target_only']:5.2f}x | {'yes' if c['lossless'] else 'NO'} | "
            f"{degeneracy_label(c)}"
        )
    for skipped in result.get("drafters_skipped") or []:
        lines.append(f"  drafter {skipped['drafter']} not compared: {skipped['reason']}")
    return lines


def degeneracy_label(cell: Mapping[str, Any]) -> str:
    """``0.14 p11 DEGENERATE`` (distinct 4-gram share, final period) for a cell with those figures, else ``-``."""
    if "distinct_4gram_share" not in cell:
        return "-"
    period = cell.get("final_period")
    text = f"{cell['distinct_4gram_share']:.3f} p{period if period else '-'}"
    return text + (" DEGENERATE" if cell.get("degenerate") else "")


def real_context_lines(result: Mapping[str, Any]) -> list[str]:
    """The real-context (teacher-forced) acceptance of a bench result as plain text lines."""
    real = result.get("real_contexts") or {}
    if real.get("status") == "skip":
        return [f"real contexts: not measured ({real.get('reason')})"]
    cells = real.get("cells") or []
    if not cells:
        return []
    sources = ", ".join(t["source"] for t in real.get("texts", []))
    lines = [
        f"drafters on {cells[0]['target']}, real contexts (teacher-forced, k={cells[0]['k']}, "
        f"{real.get('positions')} positions of {sources}): expected tok/round | accepted by position | per text"
    ]
    for c in cells:
        acc = " ".join(f"{a:.2f}" for a in c["acceptance_by_position"])
        per_text = " ".join(f"{t:.2f}" for t in c.get("tokens_per_round_by_text", []))
        lines.append(f"  {c['drafter']:<24} {c['tokens_per_round']:5.2f} | {acc} | {per_text}")
    return lines + sampled_context_lines(result)


def sampled_context_lines(result: Mapping[str, Any]) -> list[str]:
    """The sampled real-context figures beside greedy's, as plain text lines (none when not measured)."""
    real = result.get("real_contexts") or {}
    sampled = real.get("sampled") or {}
    cells = sampled.get("cells") or []
    if not cells:
        return []
    greedy = {c["drafter"]: c for c in real.get("cells") or []}
    temps = [float(t) for t in sampled.get("temperatures", [])]
    by = {(c["drafter"], float(c["temperature"])): c for c in cells}
    lines = [
        f"drafters on {cells[0]['target']}, real contexts sampled ({sampled.get('scheme')} sampling, "
        f"k={cells[0]['k']}, {sampled.get('seeds')} seeds x {cells[0]['positions']} positions per temperature): "
        "tok/round (accepted at position 1) at greedy | " + " | ".join(f"T={t:g}" for t in temps) + " | drafter q"
    ]
    for name in dict.fromkeys(c["drafter"] for c in cells):
        parts = []
        g = greedy.get(name)
        parts.append(f"{g['tokens_per_round']:5.2f} ({_first(g):.2f})" if g else "    -       ")
        for t in temps:
            c = by.get((name, t))
            parts.append(f"{c['tokens_per_round']:5.2f} ({_first(c):.2f})" if c else "    -       ")
        q = next(c["q"] for c in cells if c["drafter"] == name)
        lines.append(f"  {name:<24} " + " | ".join(parts) + f" | {q}")
    return lines


def _first(cell: Mapping[str, Any]) -> float:
    acc = cell.get("acceptance_by_position") or [0.0]
    return float(acc[0])


def peer_lines(result: Mapping[str, Any]) -> list[str]:
    """The peer comparison of a bench result as plain text lines (median, spread, pairs, load)."""
    out = []
    for peer in result.get("peers") or []:
        if peer.get("status") != "ok":
            out.append(f"peer {peer.get('peer')}: {peer.get('status')} - {peer.get('reason')}")
            continue
        out.append(
            f"peer {peer['peer']} on {peer['target']}: specproof/peer tokens/s median "
            f"{peer['tokens_per_second_ratio']:.2f}x "
            f"(min {peer['ratio_min']:.2f}, max {peer['ratio_max']:.2f}, spread {peer['ratio_spread']:.0%}) over "
            f"{peer['pairs']} alternating pairs of {peer['tokens']} tokens after a warm-up, torch threads "
            f"{peer.get('torch_threads')}, load {peer['load_before']:.2f} -> {peer['load_after']:.2f}; forwards after "
            f"prefill: specproof {peer.get('specproof_forwards')}, peer {peer.get('peer_forwards')}; "
            f"outputs equal: {'yes' if peer['outputs_equal'] else 'NO'}"
            + (f"; mlx-lm speculative decoding: {peer['mlx_speculative']}" if peer.get("mlx_speculative") else "")
        )
    return out


# --------------------------------------------------------------------------- peers


# The peers decode the trained fixture converted to each framework: a model that accepts drafts (on
# the random lfm2-tiny every draft is rejected, so a comparison there never exercises a round).
PEER_TARGET: Final = "lfm2-trained"


def _peer_hf(config: BenchConfig, drafter_factory: Callable[[], Drafter]) -> dict[str, Any]:
    row: dict[str, Any] = {"peer": "transformers prompt lookup", "target": f"hf:{PEER_TARGET}"}
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        return {**row, "status": "skip", "reason": "install specproof[hf]"}
    for mod in ("specproof.engine.targets.hf", "specproof.engine.adapters.hf_prompt_lookup"):
        if importlib.util.find_spec(mod) is None:
            return {**row, "status": "skip", "reason": f"module not available: {mod}"}
    adapter = importlib.import_module("specproof.engine.adapters.hf_prompt_lookup")
    k = 4 if 4 in config.ks else config.ks[0]
    # the trained fixture converted to transformers: only specproof.plugins.load_target builds it (the hf
    # family's own load_spec refuses `lfm2-trained`); the peer drives that model, so both engines decode
    # the same weights
    target = load_target(f"hf:{PEER_TARGET}")
    peer = adapter.HFPromptLookupEngine(target, prompt_lookup_num_tokens=k)
    return {
        **row,
        **_compare_engines(config, target, peer.generate, drafter_factory, peer_model=getattr(peer, "model", None)),
    }


def _peer_hf_assisted(config: BenchConfig, drafter_factory: Callable[[], Drafter]) -> dict[str, Any]:
    """transformers' assisted generation (``assistant_model=`` trained-small, k draft tokens a round, constant
    schedule) against specproof's engine with ``ModelDrafter`` over the same assistant model."""
    row: dict[str, Any] = {"peer": "transformers assisted generation", "target": f"hf:{PEER_TARGET}"}
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        return {**row, "status": "skip", "reason": "install specproof[hf]"}
    import torch

    from specproof.engine.targets.convert import reference_to_hf_lfm2
    from specproof.engine.targets.hf import ByteTokenizer, HFTarget
    from specproof.fixtures import load_trained_small_target

    target = load_target(f"hf:{PEER_TARGET}")
    model = target.model  # type: ignore[attr-defined]
    small = reference_to_hf_lfm2(load_trained_small_target(f"max_context={target.max_context}"))
    for m in (small,):
        m.generation_config.bos_token_id = None
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    k = 4 if 4 in config.ks else config.ks[0]
    small.generation_config.num_assistant_tokens = k
    small.generation_config.num_assistant_tokens_schedule = "constant"
    small.generation_config.assistant_confidence_threshold = 0.0
    assistant = HFTarget(small, tokenizer=ByteTokenizer(256), max_context=target.max_context, name="hf:trained-small")

    def assisted(prompt: Sequence[int], max_new_tokens: int, **_: object) -> list[int]:
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        with torch.no_grad():
            out = model.generate(
                ids,
                assistant_model=small,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                pad_token_id=0,
                attention_mask=torch.ones_like(ids),
            )
        return [int(t) for t in out[0, len(prompt) :].tolist()]

    def ours() -> Drafter:
        return ModelDrafter(assistant, name="ModelDrafter(hf:trained-small)")  # type: ignore[arg-type]

    return {**row, **_compare_engines(config, target, assisted, ours, peer_model=model)}


def _replay_lookup() -> Drafter:
    """Prompt lookup for a replay-rollback target: a match of at least 2 tokens (``ngram:2,3``)."""
    return NgramDrafter(min_n=2, max_n=3)


def _peer_mlx(config: BenchConfig, drafter_factory: Callable[[], Drafter]) -> dict[str, Any]:
    row: dict[str, Any] = {"peer": "mlx-lm greedy", "target": f"mlx:{PEER_TARGET}"}
    if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
        return {**row, "status": "skip", "reason": "install specproof[mlx]"}
    if importlib.util.find_spec("specproof.engine.targets.mlx") is None:
        return {**row, "status": "skip", "reason": "module not available: specproof.engine.targets.mlx"}
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    target = load_target(f"mlx:{PEER_TARGET}")
    model = target.model  # type: ignore[attr-defined]

    def mlx_greedy(prompt: Sequence[int], max_new_tokens: int, **_: object) -> Any:
        out: list[int] = []
        # generate_step without a sampler takes the argmax: mlx-lm's own greedy decoding
        for tok, _logprobs in generate_step(mx.array(list(prompt)), model, max_tokens=max_new_tokens):
            out.append(int(tok))
            if len(out) >= max_new_tokens:
                break
        return out

    return {**row, **_compare_engines(config, target, mlx_greedy, drafter_factory), **_mlx_speculative(target)}


def _mlx_speculative(target: Target) -> dict[str, Any]:
    """Whether mlx-lm's own speculative decoding (a draft model) runs on this hybrid; if not, its message."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    from specproof.engine.targets.convert import reference_to_mlx_lfm2
    from specproof.fixtures import load_trained_small_target

    draft = reference_to_mlx_lfm2(load_trained_small_target())
    try:
        for _ in speculative_generate_step(mx.array([104, 105, 32]), target.model, draft, max_tokens=4):  # type: ignore[attr-defined]
            pass
    except Exception as exc:  # mlx-lm refuses caches it cannot trim (the conv state of a hybrid)
        return {"mlx_speculative": f"refused: {type(exc).__name__}: {exc}"}
    return {"mlx_speculative": "runs"}


def _torch_threads(n: int | None) -> int | None:
    """Set torch's intra-op threads to ``n`` (when torch is loaded) and return the previous count."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    before = int(torch.get_num_threads())
    if n is not None:
        torch.set_num_threads(n)
    return before


def _compare_engines(
    config: BenchConfig,
    target: Target,
    peer_generate: Callable[..., Any],
    drafter_factory: Callable[[], Drafter],
    *,
    peer_model: Any = None,
) -> dict[str, Any]:
    """Tokens/s of specproof's engine over the peer's on one model: a sound comparison.

    One warm-up run of each engine (untimed: first-call allocation, lazy imports, kernel
    selection), then ``peer_repeats`` pairs, alternating which engine goes first, each
    decoding ``peer_tokens`` tokens from the same prompt, torch on one thread. The figure is
    the median of the per-pair ratios; min, max and spread ((max - min) / median) are
    reported with the load average before and after, so a noisy run shows as one. The warm-up
    runs also count model forwards (``_count_ours``, ``_count_peer``): the machine-independent part.
    """
    wl = build_workloads(("code-edit",), prompt_chars=config.prompt_chars)[0]
    n = min(config.peer_tokens, target.max_context // 4)
    # tiny peer models have short contexts: keep the prompt's end (the request) and room for n tokens
    prompt = encode_text(target, wl.text)[-(target.max_context - n - 1) :]
    k = 4 if 4 in config.ks else config.ks[0]
    rollback = "checkpoint" if callable(getattr(target, "forward_with_checkpoints", None)) else "replay"
    if rollback == "replay" and drafter_factory is NgramDrafter:
        # a rejected draft costs a replay forward on a target without checkpoints (mlx: targets, and hf: models
        # with a delta-rule state): prompt lookup drafts only on a match of >= 2 tokens
        drafter_factory = _replay_lookup
    threads_before = _torch_threads(1)
    try:
        decoder = _default_decoder(target, drafter_factory(), k=k, rollback=rollback)

        def ours() -> tuple[float, tuple[int, ...]]:
            t0 = time.perf_counter()
            toks = decoder.generate(prompt, n).tokens
            return time.perf_counter() - t0, tuple(toks)

        def theirs() -> tuple[float, tuple[int, ...]]:
            t0 = time.perf_counter()
            got = peer_generate(prompt, n)
            return time.perf_counter() - t0, tuple(int(t) for t in getattr(got, "tokens", got))

        # warm-up (untimed), counting forwards: ours at a counting wrapper, the peer's at its model
        drafter = drafter_factory()
        counted, ours_forwards = _count_ours(target, drafter, prompt, n, k=k, rollback=rollback)
        peer_forwards = _count_peer(theirs, peer_model)
        ours()
        load_before = os.getloadavg()[0]
        ratios, ours_t, peer_t, ours_tokens, peer_tokens = _alternate(ours, theirs, config.peer_repeats)
        load_after = os.getloadavg()[0]
        threads = _torch_threads(None)
    finally:
        if threads_before is not None:
            _torch_threads(threads_before)
    median = statistics.median(ratios)
    return {
        "status": "ok",
        "workload": wl.name,
        "k": k,
        "rollback": rollback,
        "tokens": n,
        "pairs": len(ratios),
        "warmup": 1,
        "torch_threads": threads,
        "drafter": getattr(drafter, "name", type(drafter).__name__),
        "specproof_forwards": ours_forwards,
        "specproof_tokens_per_round": counted.stats.mean_tokens_per_round if counted.stats else None,
        "peer_forwards": peer_forwards,
        "tokens_per_second_ratio": median,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_spread": (max(ratios) - min(ratios)) / median if median else 0.0,
        "ratios": ratios,
        "specproof_tokens_per_second": len(ours_tokens) / statistics.median(ours_t),
        "peer_tokens_per_second": len(peer_tokens) / statistics.median(peer_t),
        "load_before": load_before,
        "load_after": load_after,
        "outputs_equal": ours_tokens == peer_tokens,
    }


Timed = Callable[[], tuple[float, tuple[int, ...]]]


def _count_ours(target: Target, drafter: Drafter, prompt: Sequence[int], n: int, *, k: int, rollback: str) -> Any:
    """specproof's generation at a counting wrapper: the generation and its decode forwards."""
    counting = CountingTarget(target)
    counted = _default_decoder(counting, drafter, k=k, rollback=rollback).generate(prompt, n)  # type: ignore[arg-type]
    return counted, len(counting.decode_log(len(prompt)))


def _count_peer(theirs: Timed, peer_model: Any) -> int | None:
    """The peer's warm-up run, its model forwards counted with a forward hook (None: not a torch module)."""
    peer_calls: list[int] = []
    hook = None
    if callable(getattr(peer_model, "register_forward_hook", None)):
        hook = peer_model.register_forward_hook(lambda *_args: peer_calls.append(1))
    try:
        theirs()
    finally:
        if hook is not None:
            hook.remove()
    return len(peer_calls) - 1 if peer_calls else None  # less its prefill


def _alternate(ours: Timed, theirs: Timed, repeats: int) -> tuple[Any, ...]:
    """``repeats`` timed pairs, alternating which engine goes first: per-pair tokens/s ratios, both sides'
    seconds, and the last tokens of each."""
    ratios: list[float] = []
    ours_t: list[float] = []
    peer_t: list[float] = []
    ours_tokens: tuple[int, ...] = ()
    peer_tokens: tuple[int, ...] = ()
    for i in range(repeats):
        if i % 2 == 0:
            tp, peer_tokens = theirs()
            to, ours_tokens = ours()
        else:
            to, ours_tokens = ours()
            tp, peer_tokens = theirs()
        peer_t.append(tp)
        ours_t.append(to)
        ratios.append((len(ours_tokens) / to) / (len(peer_tokens) / tp) if peer_tokens and to > 0 else 0.0)
    return ratios, ours_t, peer_t, ours_tokens, peer_tokens


_PEER_NAMES: Final = {
    "_peer_hf": ("transformers prompt lookup", f"hf:{PEER_TARGET}", "hf"),
    "_peer_hf_assisted": ("transformers assisted generation", f"hf:{PEER_TARGET}", "hf"),
    "_peer_mlx": ("mlx-lm greedy", f"mlx:{PEER_TARGET}", "mlx"),
}


def _run_peer(fn: Callable[..., dict[str, Any]], config: BenchConfig, drafter_factory: Callable[[], Drafter]) -> dict:
    peer, target, extra = _PEER_NAMES.get(fn.__name__, (fn.__name__, "?", "?"))
    try:
        return fn(config, drafter_factory)
    except ImportError as exc:
        return {"peer": peer, "target": target, "status": "skip", "reason": f"install specproof[{extra}] ({exc})"}
    except Exception as exc:  # an installed peer that fails: its row says why, and the CLI fails the bench
        return {"peer": peer, "target": target, "status": "error", "reason": f"{type(exc).__name__}: {exc}"}


# --------------------------------------------------------------------------- the run


def plan_size(config: BenchConfig) -> int:
    """Progress steps of a run: one per cell, one per drafter context, certify, peers."""
    cells = len(config.targets) * len(config.workloads) * len(config.rollbacks) * len(config.ks)
    drafters = len(config.workloads) * len(config.drafters)
    real = (1 + len(config.drafters)) if config.real_files and config.drafters else 0
    if real and config.real_temperatures:
        real += config.real_files  # the sampled figures: one step per text
    return cells + drafters + real + 1 + int(config.certify) + (3 if config.peers else 0)


def run_bench(
    config: BenchConfig,
    *,
    drafter_factory: Callable[[], Drafter] = NgramDrafter,
    decoder_factory: DecoderFactory = _default_decoder,
    progress: ProgressHook | None = None,
) -> BenchResult:
    """Measure every figure ``config`` asks for; ``progress`` is told after each step.

    ``drafter_factory`` and ``decoder_factory`` swap the drafter and the engine (the
    gate's tests plant regressions through them).
    """
    tick = progress or (lambda _msg: None)
    t_start = time.perf_counter()
    workloads = build_workloads(config.workloads, prompt_chars=config.prompt_chars)
    drafter_specs, skipped = resolve_drafters(config)
    texts, real = _real_texts(config, drafter_specs)
    cells: list[Cell] = []
    drafter_cells: list[DrafterCell] = []
    for spec in config.targets:
        pair = (load_target(spec), load_target(spec))
        cells.extend(
            _measure_target(
                spec,
                pair,
                workloads,
                config,
                drafter_factory=drafter_factory,
                decoder_factory=decoder_factory,
                tick=tick,
            )
        )
        if spec == config.target and config.drafters:
            drafter_cells.extend(
                _measure_drafters(
                    spec,
                    pair[0],
                    workloads,
                    config,
                    drafters=drafter_specs,
                    decoder_factory=decoder_factory,
                    tick=tick,
                )
            )
            if texts:
                real = _real_figures(spec, pair[0], drafter_specs, texts, config, tick)
    drafter = _drafter_cost(drafter_factory, config.drafter_contexts, k=max(config.ks), reps=config.drafter_reps)
    tick("drafter cost")
    certify: dict[str, Any] = {"status": "skip", "reason": "skipped by --quick: it takes about 2 minutes here"}
    if config.certify:
        certify = _certify_wall()
        tick("certify --profile ci")
    peers: list[dict[str, Any]] = []
    for fn in (_peer_hf, _peer_hf_assisted, _peer_mlx) if config.peers else ():
        peers.append(_run_peer(fn, config, drafter_factory))
        tick(f"peer {peers[-1].get('peer')}")
    return BenchResult(
        config=config,
        cells=tuple(cells),
        drafter_cells=tuple(drafter_cells),
        workloads=tuple(workloads),
        drafter=drafter,
        certify=certify,
        peers=tuple(peers),
        platform=platform_info(),
        seconds=time.perf_counter() - t_start,
        real_contexts=real,
        drafters_skipped=skipped,
    )


def _real_texts(config: BenchConfig, drafter_specs: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    """The held-out texts of the real-context acceptance, or why there are none (a skip record)."""
    if not (config.real_files and drafter_specs):
        return [], {}
    try:
        texts = real_context_texts(
            files=config.real_files,
            text_tokens=config.real_tokens,
            stride=config.real_stride,
            min_prefix=config.real_min_prefix,
        )
    except InvalidSettingError as exc:  # a Python installed without its test suite: say so, measure the rest
        return [], {"status": "skip", "reason": str(exc)}
    return list(texts), {}


def _real_figures(
    spec: str, target: Target, drafter_specs: Sequence[str], texts: list[Any], config: BenchConfig, tick: ProgressHook
) -> dict[str, Any]:
    """Each drafter's teacher-forced acceptance on the real texts, as the result's ``real_contexts``."""
    k = 4 if 4 in config.ks else config.ks[0]
    makers = [(d, spec_factory(d)) for d in drafter_specs]
    real_cells = measure_real_contexts(spec, target, makers, texts, k=k, tick=tick)
    out: dict[str, Any] = {
        "status": "ok",
        "method": "teacher-forced: the target's greedy k+1 tokens from a real prefix vs each drafter's "
        "k-token proposal from it",
        "texts": [t.to_json() for t in texts],
        "positions": sum(len(t.positions) for t in texts),
        "cells": [c.to_json() for c in real_cells],
    }
    if config.real_temperatures:
        sampled = measure_sampled_contexts(
            spec, target, makers, texts, k=k, temperatures=config.real_temperatures, seeds=config.real_seeds, tick=tick
        )
        out["sampled"] = {
            "status": "ok",
            "method": "at each real-context position, each drafter samples k tokens at temperature T (q one-hot for a "
            "deterministic drafter); the target verifies them in one forward and keeps them by rejection sampling, "
            "as SpecDecoder(scheme='rejection') does",
            "scheme": "rejection",
            "temperatures": [float(t) for t in config.real_temperatures],
            "seeds": config.real_seeds,
            "seed": SAMPLED_SEED,
            "cells": [c.to_json() for c in sampled],
        }
    return out
