"""The bench as a pipeline: configuration, workloads, one measurement per kind of figure, the result.

``run_bench`` settles what every measurement reads (``BenchRun``: the workloads, the drafters the
run compares — a spec that does not resolve is a usage error here, before any measuring), then runs
each of ``MEASUREMENTS`` in turn and gathers the result fields they return into a ``BenchResult``.
The gate (``_gate``) and the text (``_render``) read that result's JSON. A new kind of figure is a
module implementing ``Measurement`` (``_protocol``) and its entry below.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from specproof.bench._batches import BatchFigures
from specproof.bench._config import BenchConfig
from specproof.bench._counting import DecoderFactory, default_decoder
from specproof.bench._drafters import DrafterCells, resolve_drafters
from specproof.bench._overheads import CertifyWall, DrafterCost
from specproof.bench._peers import Peers
from specproof.bench._protocol import BenchRun, Measurement, ProgressHook
from specproof.bench._real_figures import RealContexts
from specproof.bench._records import BenchResult, platform_info
from specproof.bench._speed import SpeedCells
from specproof.bench._trees import TreeFigures
from specproof.bench._workloads import build_workloads
from specproof.contract import Drafter
from specproof.engine import NgramDrafter

__all__ = ["MEASUREMENTS", "plan_size", "run_bench"]

#: The kinds of figure a run measures, in the order it measures them.
MEASUREMENTS: Final[tuple[Measurement, ...]] = (
    SpeedCells(),
    DrafterCells(),
    RealContexts(),
    BatchFigures(),
    TreeFigures(),
    DrafterCost(),
    CertifyWall(),
    Peers(),
)


def plan_size(config: BenchConfig) -> int:
    """Progress steps of a run: the sum of its measurements' steps."""
    return sum(m.steps(config) for m in MEASUREMENTS)


def run_bench(
    config: BenchConfig,
    *,
    drafter_factory: Callable[[], Drafter] = NgramDrafter,
    decoder_factory: DecoderFactory = default_decoder,
    progress: ProgressHook | None = None,
) -> BenchResult:
    """Measure every figure ``config`` asks for; ``progress`` is told after each step.

    ``drafter_factory`` and ``decoder_factory`` swap the drafter and the engine (the
    gate's tests plant regressions through them).
    """
    t_start = time.perf_counter()
    drafters, skipped = resolve_drafters(config)
    run = BenchRun(
        config=config,
        workloads=tuple(build_workloads(config.workloads, prompt_chars=config.prompt_chars)),
        drafters=drafters,
        drafters_skipped=skipped,
        drafter_factory=drafter_factory,
        decoder_factory=decoder_factory,
        tick=progress or (lambda _msg: None),
    )
    fields: dict[str, Any] = {}
    for measurement in MEASUREMENTS:
        fields.update(measurement.measure(run))
    return BenchResult(
        config=config,
        workloads=run.workloads,
        platform=platform_info(),
        seconds=time.perf_counter() - t_start,
        **fields,
    )
