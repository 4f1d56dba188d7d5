"""Drafter acceptance on real contexts: teacher-forced on held-out text, greedy (``_real``) and sampled by
rejection sampling at fixed temperatures and seeds (``_sampled``); the figure drafters are compared on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from specproof.bench._config import BenchConfig, first_k
from specproof.bench._protocol import BenchRun, ProgressHook
from specproof.bench._real import measure_real_contexts, real_context_texts
from specproof.bench._sampled import SAMPLED_SEED, measure_sampled_contexts
from specproof.contract import Target
from specproof.contract.errors import InvalidSettingError
from specproof.plugins import drafter_factory as spec_factory

__all__ = ["RealContexts"]


@attrs.frozen
class RealContexts:
    """The result's ``real_contexts`` (with ``sampled`` inside when ``config.real_temperatures``)."""

    def steps(self, config: BenchConfig) -> int:
        steps = (1 + len(config.drafters)) if config.real_files and config.drafters else 0
        if steps and config.real_temperatures:
            steps += config.real_files  # the sampled figures: one step per text
        return steps

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        texts, real = _real_texts(run.config, run.drafters)
        if texts:
            spec = run.config.target
            real = _real_figures(spec, run.pair(spec)[0], run.drafters, texts, run.config, run.tick)
        return {"real_contexts": real}


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
    k = first_k(config)
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
