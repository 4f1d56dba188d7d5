"""What one bench run measures: ``BenchConfig``, its two presets, and the targets and drafters it names.

The first room of the pipeline (``_pipeline``): every option is validated here, once, before any
measuring; the measurements only read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from specproof.bench._workloads import WORKLOAD_NAMES
from specproof.contract.errors import InvalidSettingError
from specproof.engine.drafters.trees import parse_tree_shape

__all__ = [
    "BATCH_SIZES",
    "DEFAULT_TARGET",
    "DRAFTER_COMPARISON",
    "MOE_COMPANION",
    "OPTIONAL_DRAFTERS",
    "SAMPLED_TEMPERATURES",
    "TREE_DRAFTERS",
    "TREE_SHAPES",
    "BenchConfig",
    "first_k",
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
# The temperatures the sampled real-context figures are measured at (issue 28; ``_sampled``).
SAMPLED_TEMPERATURES: Final = (0.7, 1.0)
# The batch sizes the batched reference decoder is measured at, beside the single-request engine.
BATCH_SIZES: Final = (1, 4, 16)
# With ``trees`` (``--trees``): the tree shapes and the drafters whose trees are set beside their chains.
TREE_SHAPES: Final = ("2x2x2", "4-2-1", "dynamic:16")
TREE_DRAFTERS: Final = ("eagle:trained", "model:trained-small")


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
    batch_sizes: tuple[int, ...] = BATCH_SIZES  # the batched decoder beside the single engine (empty: not measured)
    batch_tokens: int = 32  # new tokens of each request of a batch
    trees: bool = False  # token trees beside chains (``_trees``): off by default, so the default gate never pays
    tree_shapes: tuple[str, ...] = TREE_SHAPES
    tree_drafters: tuple[str, ...] = TREE_DRAFTERS
    tree_tokens: int = 64  # new tokens after each workload's prompt in the timed tree decoding

    def __attrs_post_init__(self) -> None:
        _check_ints("ks", self.ks, 1)
        _check_ints("drafter_contexts", self.drafter_contexts, 16)
        for name in ("chunk_tokens", "chunks", "verify_reps", "drafter_reps", "peer_tokens", "peer_repeats"):
            _check_ints(name, [getattr(self, name)], 1)
        _check_ints("real_files", [self.real_files], 0)
        if self.batch_sizes:
            _check_ints("batch_sizes", self.batch_sizes, 1)
        _check_ints("batch_tokens", [self.batch_tokens], 1)
        _check_ints("tree_tokens", [self.tree_tokens], 1)
        if not isinstance(self.trees, bool):
            raise InvalidSettingError(f"BenchConfig.trees={self.trees!r} must be True or False")
        for shape in self.tree_shapes:
            parse_tree_shape(shape)  # a bad shape names itself here, before any measuring
        for spec in self.tree_drafters:
            if spec.partition(":")[0] not in ("model", "eagle", "mtp"):
                raise InvalidSettingError(
                    f"BenchConfig.tree_drafters: {spec!r} is not a model:, eagle: or mtp: drafter "
                    "(a top-k tree needs its logits rows)"
                )
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
            batch_tokens=64,
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


def first_k(config: BenchConfig) -> int:
    """The k the single-k figures use (drafters, real contexts, peers): 4 when the run has it, else its first."""
    return 4 if 4 in config.ks else config.ks[0]
