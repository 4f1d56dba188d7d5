"""Costs beside the cells: the drafter's cost per proposal at growing contexts, and certify's wall time."""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from specproof.bench._config import BenchConfig
from specproof.bench._protocol import BenchRun
from specproof.bench._workloads import stdlib_token_stream
from specproof.contract import Drafter
from specproof.engine import ContextView

__all__ = ["CertifyWall", "DrafterCost"]


@attrs.frozen
class DrafterCost:
    """The result's ``drafter``: the run's drafter, proposal time at each of ``config.drafter_contexts``."""

    def steps(self, config: BenchConfig) -> int:
        return 1

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        config = run.config
        cost = _drafter_cost(run.drafter_factory, config.drafter_contexts, k=max(config.ks), reps=config.drafter_reps)
        run.tick("drafter cost")
        return {"drafter": cost}


@attrs.frozen
class CertifyWall:
    """The result's ``certify``: ``specproof certify --profile ci`` wall time (full runs only)."""

    def steps(self, config: BenchConfig) -> int:
        return int(config.certify)

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        if not run.config.certify:
            return {"certify": {"status": "skip", "reason": "skipped by --quick: it takes about 2 minutes here"}}
        wall = _certify_wall()
        run.tick("certify --profile ci")
        return {"certify": wall}


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
