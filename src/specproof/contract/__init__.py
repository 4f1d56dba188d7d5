"""specproof.contract: the bottom layer every other part of specproof builds on.

It imports nothing from specproof above it (a test fails on any import cycle):

- the protocols (``Target``, ``Drafter``, ``Engine``, ...) and records (``Step``, ``Stats``,
  ``Generation``) of the decode convention (docs/contract.md);
- ``errors`` — every error specproof raises on purpose, including ``UsageError`` (exit 2);
- ``Violation`` / ``ViolationError`` — one breach of one invariant, as every check reports it;
- ``compare`` — the one array comparison (exact or within ``atol``; NaN and signed-zero policy);
- ``lossless`` — the tie-aware ``engine.lossless`` verdict;
- ``validation`` — the one check of an integer option's lower bound and of a tolerance;
- the batched engine's protocol and records (``BatchEngine``, ``BatchRequest``, ``BatchCapabilities``,
  ``RequestOutput``, ``run_batch``; docs/contract.md, "Batches");
- ``sampling`` — ``SamplingParams`` and the target's processed distribution ``p`` (docs/contract.md, "Sampling");
- ``DecodeParams`` (a request's logits processors and stops) and ``decode_state``, their oracle
  (docs/contract.md, "Decode state").
"""

from specproof.contract._batch import (
    PREEMPTION_MODES,
    BatchCapabilities,
    BatchEngine,
    BatchRequest,
    RequestOutput,
    run_alone,
    run_batch,
)
from specproof.contract._decode_params import DECODE_FEATURES, DecodeParams
from specproof.contract._grammar import GRAMMAR_KINDS, Grammar
from specproof.contract._logprobs import LOGPROB_TOLERANCE, TokenLogprob
from specproof.contract._protocols import (
    CheckpointingTarget,
    Drafter,
    Engine,
    FeatureDrafter,
    FeatureTarget,
    SamplingDrafter,
    Target,
    WhiteBoxTarget,
)
from specproof.contract._records import STOP_REASONS, Generation, Stats, Step, StopReason
from specproof.contract._violations import INVARIANT_ID, Violation, ViolationError
from specproof.contract._vocab_bytes import SMALL_ALPHABET, token_bytes
from specproof.contract.compare import arrays_differ, live_state_differs, states_differ
from specproof.contract.errors import SpecproofError, UsageError
from specproof.contract.sampling import SampledDraft, SamplingParams, processed_distribution
from specproof.contract.validation import int_at_least, validate_tolerance

__all__ = [
    "DECODE_FEATURES",
    "INVARIANT_ID",
    "LOGPROB_TOLERANCE",
    "PREEMPTION_MODES",
    "STOP_REASONS",
    "BatchCapabilities",
    "BatchEngine",
    "BatchRequest",
    "CheckpointingTarget",
    "DecodeParams",
    "GRAMMAR_KINDS",
    "Grammar",
    "SMALL_ALPHABET",
    "token_bytes",
    "Drafter",
    "Engine",
    "FeatureDrafter",
    "FeatureTarget",
    "Generation",
    "SampledDraft",
    "SamplingDrafter",
    "SamplingParams",
    "SpecproofError",
    "Stats",
    "Step",
    "StopReason",
    "Target",
    "TokenLogprob",
    "UsageError",
    "Violation",
    "RequestOutput",
    "ViolationError",
    "WhiteBoxTarget",
    "arrays_differ",
    "int_at_least",
    "live_state_differs",
    "processed_distribution",
    "run_alone",
    "run_batch",
    "states_differ",
    "validate_tolerance",
]
