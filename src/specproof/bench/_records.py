"""The records of a bench run: one ``Cell`` per speed cell, one ``DrafterCell`` per drafter and workload,
and ``BenchResult``, everything one run measured (its JSON is ``specproof.formats.bench``)."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from specproof._version import __version__
from specproof.bench._config import BenchConfig
from specproof.bench._workloads import Workload
from specproof.formats import bench as bench_format

__all__ = ["BenchResult", "Cell", "DrafterCell", "platform_info"]


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
    batches: Mapping[str, Any] = attrs.field(factory=dict)
    trees: Mapping[str, Any] = attrs.field(factory=dict)

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
            **({"batches": dict(self.batches)} if self.batches else {}),
            **({"trees": dict(self.trees)} if self.trees else {}),
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
