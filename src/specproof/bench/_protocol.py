"""The one protocol every kind of bench figure implements, and the run it measures on.

A ``Measurement`` says how many progress steps it takes for a configuration and measures its part
of the result from a ``BenchRun``: the validated configuration, the workloads, the drafters it
compares, the targets (loaded once per run and shared) and the hooks the gate's tests plant
regressions through. It returns the ``BenchResult`` fields it fills, keyed by name. The pipeline
(``_pipeline``) runs each measurement in turn; a measurement never calls back into it nor into
another measurement, so a new kind of figure is one new module and one entry in the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from specproof.bench._config import BenchConfig
from specproof.bench._counting import DecoderFactory
from specproof.bench._workloads import Workload
from specproof.contract import Drafter, Target
from specproof.plugins import load_target

__all__ = ["BenchRun", "Measurement", "ProgressHook"]

ProgressHook = Callable[[str], None]


@attrs.define(kw_only=True)
class BenchRun:
    """What every measurement of one run reads: settled before the first one measures."""

    config: BenchConfig
    workloads: tuple[Workload, ...]
    drafters: tuple[str, ...]  # the drafter specs compared (config.drafters + the optional ones that resolve)
    drafters_skipped: tuple[Mapping[str, str], ...]
    drafter_factory: Callable[[], Drafter]
    decoder_factory: DecoderFactory
    tick: ProgressHook
    _pairs: dict[str, tuple[Target, Target]] = attrs.field(factory=dict, alias="_pairs")

    def pair(self, spec: str) -> tuple[Target, Target]:
        """Two instances of the target ``spec`` (greedy side, speculative side), loaded once per run."""
        if spec not in self._pairs:
            self._pairs[spec] = (load_target(spec), load_target(spec))
        return self._pairs[spec]


class Measurement(Protocol):
    """One kind of figure (speed, drafter acceptance, real contexts, peers, batches, ...)."""

    def steps(self, config: BenchConfig) -> int:
        """Progress steps it reports for ``config`` (the CLI's progress bar sums them)."""
        ...

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        """Its figures, as the ``BenchResult`` fields they fill (``tick`` once per step)."""
        ...
