"""Bench records and configurations shared by the bench and schema tests: a synthetic result
(``result``, ``cell``) and the smallest real bench configuration (``tiny_config``)."""

from __future__ import annotations

from specproof.bench import BenchConfig


def cell(workload: str, rollback: str, **over: float) -> dict:
    cell = {
        "key": f"{workload}/reference/{rollback}/k4",
        "workload": workload,
        "target": "reference",
        "rollback": rollback,
        "k": 4,
        "tokens_per_round": 2.5,
        "projected_speedup": 2.5 if rollback == "checkpoint" else 1.9,
        "forwards_per_token": 0.4 if rollback == "checkpoint" else 0.52,
        "speedup": 1.8,
        "efficiency": 0.72,
    }
    cell.update(over)
    return cell


def result(cells: list[dict] | None = None, *, scaling: float = 1.0, mode: str = "quick") -> dict:
    return {
        "version": "0.1.0",
        "platform": {"python": "3.11", "cpus": "2"},
        "config": {"mode": mode, "target": "reference"},
        "cells": cells if cells is not None else [cell("code-edit", "checkpoint"), cell("code-edit", "replay")],
        "drafter": {"scaling": scaling},
    }


def tiny_config(*, chunks: int = 12) -> BenchConfig:
    # the four workloads at --quick's chunk size (the pooled CPU figure's noise was measured on them),
    # one rollback: the timed figures only (no drafter comparison, real contexts, batches or peers)
    return BenchConfig(
        mode="quick",
        companions=(),
        rollbacks=("checkpoint",),
        prompt_chars=400,
        chunk_tokens=16,
        chunks=chunks,
        verify_reps=5,
        drafter_contexts=(1024, 8192),
        drafter_reps=100,
        drafters=(),
        real_files=0,
        peers=False,
        batch_sizes=(),
    )
