"""``specproof bench --drafter SPEC``: one drafter's acceptance on one target, as a bench result.

``resolve_drafter_target`` settles the drafter and its target before any measuring (a bad spec,
a feature drafter on the wrong target, or one that needs ``--target`` and has none: one usage
error); ``run_drafter_bench`` measures (``_acceptance``) and returns a bench result
(``specproof.formats.bench``) whose ``acceptance`` holds the counts (its speed sections are empty: the run measures
nothing else), which ``save_baseline`` and ``compare`` take as they take a speed run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from specproof._version import __version__
from specproof.bench._acceptance import acceptance_k, measure_acceptance
from specproof.bench._config import DEFAULT_TARGET, BenchConfig
from specproof.bench._records import platform_info
from specproof.bench._workloads import build_workloads
from specproof.contract import Drafter, UsageError
from specproof.formats import bench as bench_format
from specproof.plugins import drafter_factory, load_target

__all__ = ["drafter_plan_size", "resolve_drafter_target", "run_drafter_bench"]


def resolve_drafter_target(drafter: str, target: str | None) -> tuple[str, Callable[[], Drafter]]:
    """The target spec a ``--drafter`` run measures on, and the drafter's factory (one instance made now).

    ``target`` is ``--target`` (None when not given). A feature drafter declaring ``feature_target_spec``
    (``eagle:trained``, ``mtp:trained``) defaults to that target, and another target family is a usage error
    (its heads cannot read that model's hidden states); a feature drafter that declares no target needs
    ``--target``; any other drafter defaults to the bench's target.
    """
    factory = drafter_factory(drafter)  # PluginError (a usage error) naming the spec on a bad one
    instance = factory()
    feature = getattr(instance, "feature_target_spec", None)
    feature = feature if isinstance(feature, str) and feature else None
    reads_features = bool(getattr(instance, "feature_layers", None))
    if target is None:
        if feature is not None:
            target = feature
        elif reads_features:
            raise UsageError(
                f"--drafter {drafter!r} reads a target's hidden states (feature_layers) but does not say which "
                "target (no feature_target_spec): pass --target SPEC, the target it was trained on"
            )
        else:
            target = DEFAULT_TARGET
    elif feature is not None and target.partition(":")[0] != feature.partition(":")[0]:
        raise UsageError(
            f"--drafter {drafter!r} reads the hidden states of target {feature!r}, not --target {target!r}: "
            f"drop --target (it defaults to {feature!r}) or pass --target {feature}"
        )
    loaded = load_target(target)  # a bad --target is a usage error now, not after the first workload
    if loaded.vocab_size < 256 and not callable(getattr(loaded, "encode", None)):
        # the real contexts and the workloads are text: the same test the measure makes, made before it starts
        raise UsageError(
            f"--drafter {drafter!r}: its target {target!r} is not byte-level (vocab {loaded.vocab_size}, no "
            "encode()), and the acceptance gate measures on text; gate a drafter of a byte-level target "
            "(trained, reference, or one with an encode())"
        )
    return target, factory


def drafter_plan_size(config: BenchConfig) -> int:
    """Progress steps of a ``--drafter`` run: one per held-out text and one per workload."""
    return config.real_files + len(config.workloads)


def run_drafter_bench(
    config: BenchConfig,
    drafter: str,
    factory: Callable[[], Drafter],
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure ``drafter``'s acceptance on ``config.target`` (``config``'s real-context and workload sizes, its
    k): a bench result document (``specproof.formats.bench``) with ``acceptance`` and empty speed sections."""
    t0 = time.perf_counter()
    target = load_target(config.target)
    record = measure_acceptance(
        drafter_spec=drafter,
        factory=factory,
        target_spec=config.target,
        target=target,
        k=acceptance_k(config.ks),
        workloads=config.workloads,
        prompt_chars=config.prompt_chars,
        decode_tokens=config.decode_tokens,
        chunk_tokens=config.chunk_tokens,
        real_files=config.real_files,
        real_tokens=config.real_tokens,
        real_stride=config.real_stride,
        real_min_prefix=config.real_min_prefix,
        tick=progress or (lambda _m: None),
    )
    cfg = config.to_json()
    cfg["drafter"] = drafter
    return {
        "schema": bench_format.ID,
        "version": __version__,
        "platform": platform_info(),
        "config": cfg,
        "workloads": [w.to_json() for w in build_workloads(config.workloads, prompt_chars=config.prompt_chars)],
        "cells": [],
        "drafter_cells": [],
        "drafters_skipped": [],
        "real_contexts": {},
        "drafter": {},
        "certify": {"status": "skip", "reason": "a --drafter run measures the drafter's acceptance only"},
        "peers": [],
        "seconds": time.perf_counter() - t0,
        "acceptance": record,
    }
