"""Drafter acceptance, free-running: every compared drafter on every workload, on the bench target.

Tokens per round and acceptance by position counted at the target (``_counting``), draft-model
forwards and bytes counted at the draft model, and the wall cost of a proposal over a target step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from specproof.bench._config import OPTIONAL_DRAFTERS, BenchConfig, first_k
from specproof.bench._counting import (
    CountingTarget,
    DecoderFactory,
    count_greedy,
    count_spec,
    degeneracy_figures,
    greedy_chunk,
    prefill,
)
from specproof.bench._protocol import BenchRun, ProgressHook
from specproof.bench._records import DrafterCell
from specproof.bench._workloads import Workload, encode_text
from specproof.contract import Drafter, Target
from specproof.contract.errors import SpecproofError
from specproof.engine.drafters import CombinedDrafter, ModelDrafter
from specproof.plugins import drafter_factory as spec_factory
from specproof.plugins import load_drafter, load_target

__all__ = ["DrafterCells", "comparison_drafter", "resolve_drafters"]


@attrs.frozen
class DrafterCells:
    """The result's ``drafter_cells`` (and ``drafters_skipped``): the run's drafters on its bench target."""

    def steps(self, config: BenchConfig) -> int:
        return len(config.workloads) * len(config.drafters)

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        cells: list[DrafterCell] = []
        if run.config.drafters:
            target = run.pair(run.config.target)[0]
            cells = _measure_drafters(
                run.config.target,
                target,
                run.workloads,
                run.config,
                drafters=run.drafters,
                decoder_factory=run.decoder_factory,
                tick=run.tick,
            )
        return {"drafter_cells": tuple(cells), "drafters_skipped": run.drafters_skipped}


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
    k = first_k(config)
    rollback = "checkpoint" if callable(getattr(target, "forward_with_checkpoints", None)) else "replay"
    pb = getattr(target, "parameter_bytes", None)
    target_bytes = float(pb()["dense"]) if callable(pb) else 1.0
    out: list[DrafterCell] = []
    for wl in workloads:
        prompt = encode_text(target, wl.text)
        oracle = count_greedy(target, prompt, config.decode_tokens)
        degeneracy = degeneracy_figures(oracle.tokens)
        # the wall time of a one-token target step, from the prompt's state
        prefill(target, prompt)
        step_times: list[float] = []
        pending = prompt[-1]
        for _ in range(4):
            t, got = greedy_chunk(target, pending, 8)
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
