"""specproof.conformance.zoo: deliberately broken implementations the suite must reject.

Every member breaks exactly one invariant of the catalogue, the way a real engine,
drafter or model export once did. Each is a plug-in (``specproof.conformance.zoo:<name>``,
a zero-argument factory), so it is certified through the ordinary paths::

    specproof certify engine --engine specproof.conformance.zoo:drops_bonus_token
    specproof certify target --target specproof.conformance.zoo:restore_forgets_conv

and ``ZOO`` says, per member, what kind of subject it is, which invariant it breaks
(and which others the same bug is also caught by), and what the bug is. The
meta-tests (``tests/conformance/test_zoo.py``) certify every member and require the named
invariant to fail.

Each family also has its correct *control* (``lookup_drafter``, ``zoo_target``,
``zoo_engine``): the same code with no bug, which certification accepts, so a
member's failure is due to its one change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal

import attrs

from specproof.conformance._registry import REGISTRY, Invariant
from specproof.conformance.zoo import _model_drafters
from specproof.conformance.zoo._batch_decode_engines import BatchSharedPenaltyBuffer
from specproof.conformance.zoo._batch_engines import (
    BatchFifoTwoRows,
    BatchOneRngStream,
    BatchPadsRecurrentState,
    BatchRecomputeOnly,
    BatchReplayEngine,
    BatchRetriesRejectedRow,
    BatchRollbackWrongSlot,
    BatchSeedIgnoredBesideUnseeded,
    BatchSlotNotCleared,
    BatchStaleResume,
    BatchStaleZeroDraft,
    BatchTemperatureFromFirstRow,
    BatchVerifyDependsOnBatchSize,
    BatchZooEngine,
)
from specproof.conformance.zoo._batch_grammar_engines import (
    BatchGrammarRollbackWrongRequest,
    BatchScratchMatchers,
    BatchSharedGrammarMatcher,
)
from specproof.conformance.zoo._decode_case_engines import DECODE_CASE_MEMBERS
from specproof.conformance.zoo._decode_engines import (
    CheckpointedProcessorsEngine,
    DecodeReplayEngine,
    DecodeZooEngine,
    LogitBiasIgnoredWhenDrafting,
    MinTokensExtraRow,
    PenaltiesIgnoredWhenDrafting,
    PenaltyBufferKeepsRejected,
    PenaltyFromLastToken,
    StopMissedInsideBlock,
)
from specproof.conformance.zoo._drafters import (
    LookupDrafter,
    MatchPointer,
    MutatesInput,
    Nondeterministic,
    OutOfRange,
    ReadsPastContext,
    ReturnsGenerator,
    StickyCache,
    TooLong,
)
from specproof.conformance.zoo._engines import (
    AcceptsPastMismatch,
    DraftsPastK,
    DropsBonusToken,
    DropsLastStepAtEos,
    EmitsAfterEos,
    EosMaskedByLengthCap,
    ForgetsRecurrentRestore,
    GreedyOnlyEngine,
    IgnoresSuiteDrafts,
    LeaksPlaceholderId,
    LengthCapHidesEosInBlock,
    OracleOnlyEngine,
    OwnCopyEngine,
    OwnDraftsEngine,
    ProcessedOffByOne,
    RaisesEveryCall,
    RefeedsAcceptedFirst,
    ReplaysDespiteCheckpoints,
    StaleStateAfterZeroDraft,
    TrustsOverlongDraft,
    VaryingK,
    VerifiesOwnDraft,
    ZooEngine,
)
from specproof.conformance.zoo._feature_drafters import (
    FeatureFromRejected,
    FeaturesShifted,
    FeaturesStaleAcrossRequests,
    FeaturesWrongLayer,
    FeatureZooEngine,
    HeadDrafter,
    HeadKeepsChain,
    HeadRecomputesFeatures,
    head_drafter,
)
from specproof.conformance.zoo._feature_sessions import (
    FeatureSessionEngine,
    PrefixHitStaleFeatures,
    PrefixHitZeroFeatures,
)
from specproof.conformance.zoo._grammar_engines import (
    GrammarMaskFirstRowOnly,
    GrammarNotRolledBack,
    GrammarOffWhenDelimiterInBlock,
    GrammarOneBehindAfterBlock,
    GrammarTerminatedAdvanced,
    ScratchMatcherEngine,
)
from specproof.conformance.zoo._grammar_sampled_engines import (
    GrammarFollowsArgmaxWhenSampling,
    GrammarUnmaskedResidualWhenSampling,
)
from specproof.conformance.zoo._history_drafters import DeclaredPromptOnlyLookup, PromptOnlyLookup
from specproof.conformance.zoo._logprob_engines import (
    DecodeMatchEngine,
    Float32LogprobsEngine,
    FrequencyPenaltyIgnored,
    LogprobsBeforeProcessors,
    LogprobsFromDrafter,
    LogprobsPastStop,
    LogprobsWrongRow,
    PenaltiesSkippedWhenSampling,
    StopStringMissedAcrossRounds,
)
from specproof.conformance.zoo._model_drafters import (
    DraftKVOnlyRollback,
    DraftNoRollback,
    DraftResetKeepsModel,
)
from specproof.conformance.zoo._model_drafters import (
    model_drafter_checkpoint as model_drafter_checkpoint,
)
from specproof.conformance.zoo._model_drafters import (
    model_drafter_replay as model_drafter_replay,
)
from specproof.conformance.zoo._model_drafters import (
    model_drafter_reprefill as model_drafter_reprefill,
)
from specproof.conformance.zoo._prompt_logprob_engines import PROMPT_LOGPROB_MEMBERS, PromptLogprobsFloat32
from specproof.conformance.zoo._reaching_drafters import (
    HeadKeepsChainAfterFullAccept,
    HeadLazyReset,
    HeadLazyResetKeepsLonger,
    HeadReprefills,
    MutatesOnLaterRequest,
    RaisesOnShorterRequest,
    SessionLookup,
)
from specproof.conformance.zoo._relation_drafters import (
    DepthGrowsOverRequests,
    DraftCacheIgnoresK,
    EarlyEditKeepsIndex,
    IncrementalLookup,
    ResetKeepsIndexPointer,
)
from specproof.conformance.zoo._sampling_engines import (
    ArgmaxVerification,
    BonusAfterAcceptedEos,
    BonusFromWrongRow,
    BroadcastSeed,
    DrafterIgnoresRng,
    DraftSampler,
    GreedyLimitSamples,
    MatchesArgmaxAtLastPosition,
    QFromRawLogits,
    QOfNextPosition,
    ResidualFromP,
    SampledCountsReplacement,
    SamplesPaddedVocab,
    SamplingZooEngine,
    SharedRngStream,
    UnfilteredSampling,
    UnnormalizedResidual,
    UnseededDrafterRng,
)
from specproof.conformance.zoo._session_cache_decode import DecodeSessionEngine, SessionPenaltiesCarriedOver
from specproof.conformance.zoo._session_decode_engines import (
    OutputCarriedOver,
    PenaltyCountsCarriedOver,
    SessionPenaltyBufferCleared,
)
from specproof.conformance.zoo._session_engines import (
    BlockCacheWithoutPrefix,
    NeverReusesPrefix,
    OverclaimsPrefixReuse,
    SnapshotOnlyLastCall,
    StalePrefixCache,
)
from specproof.conformance.zoo._session_engines import (
    continuation_only_session_engine as continuation_only_session_engine,
)
from specproof.conformance.zoo._session_engines import (
    greedy_only_session_engine as greedy_only_session_engine,
)
from specproof.conformance.zoo._session_engines import (
    session_engine as session_engine,
)
from specproof.conformance.zoo._session_engines import (
    session_engine_replay as session_engine_replay,
)
from specproof.conformance.zoo._session_engines import (
    varying_k_session_engine as varying_k_session_engine,
)
from specproof.conformance.zoo._stop_string_engines import STOP_STRING_MEMBERS, StopStringTailWindow
from specproof.conformance.zoo._targets import (
    ZOO_CONFIG,
    CapacityWraps,
    CheckpointsOffByOne,
    ChunkedForwardDiffers,
    DriftsFromSource,
    MaskLeaksNextToken,
    PadsVocab,
    ProcessedIsLastIndex,
    ResetKeepsConv,
    RestoreForgetsConv,
    RestoreForgetsRec,
    ZooTarget,
    small_reference,
)
from specproof.conformance.zoo._tree_drafters import TREE_DRAFTER_MEMBERS
from specproof.conformance.zoo._tree_drafters import dynamic_tree_drafter as dynamic_tree_drafter
from specproof.conformance.zoo._tree_drafters import ngram_tree_drafter as ngram_tree_drafter
from specproof.conformance.zoo._tree_drafters import tree_drafter as tree_drafter
from specproof.conformance.zoo._tree_engines import TREE_MEMBERS, TreeReplayEngine, TreeZooEngine
from specproof.conformance.zoo._tree_sampling_engines import TREE_SAMPLING_MEMBERS, TreeMatchSamplingEngine
from specproof.engine.drafters.suffix import SuffixDrafter

Kind = Literal["drafter", "target", "engine"]
MemberEntry = tuple[Kind, type] | tuple[Kind, type, Callable[[], object]]
_MODULE = "specproof.conformance.zoo"


@attrs.frozen(kw_only=True)
class ZooMember:
    """One broken implementation.

    ``invariant`` is the id it is registered as breaking (``certify --only`` it fails);
    ``also`` lists other ids the same bug is documented to trip (a full run may report
    them too); ``spec`` is its plug-in spec for ``--drafter/--target/--engine``.
    Unpacks as ``kind, invariant, description, spec = member``.
    """

    name: str
    kind: Kind
    invariant: str = attrs.field(validator=attrs.validators.in_([inv.id for inv in REGISTRY]))
    description: str
    spec: str
    implementation: type = attrs.field(repr=False)
    also: tuple[str, ...] = ()
    # "quick": derandomized ``certify --profile quick`` rejects it; "search": it takes a randomized
    # search to find (a ``--seed``, a ``specproof fuzz`` campaign), after which the example database
    # replays it in every later run
    # the profile whose derandomized run rejects it ("ci": a deviation below quick's sensitivity), or
    # "search" (a randomized search: a --seed or a fuzz campaign)
    found_by: Literal["quick", "ci", "search"] = "quick"

    def __iter__(self) -> Iterator[str]:
        return iter((self.kind, self.invariant, self.description, self.spec))

    @property
    def caught_by(self) -> tuple[str, ...]:
        """The registered invariant and its documented alternates."""
        return (self.invariant, *self.also)

    def cli_args(self) -> list[str]:
        """``certify`` arguments that certify this member: the subject and its plug-in option."""
        return [self.kind, f"--{self.kind}", self.spec]


# ---------------------------------------------------------------------------- factories (the plug-ins)

# The members\' factories are made from ``_MEMBERS`` below (``__getattr__``); these are the controls and
# the correct-but-different implementations.


def own_drafts_engine() -> OwnDraftsEngine:
    """Correct: drafts for itself, declares no ``suite_drafts`` (judged on its own drafts)."""
    return OwnDraftsEngine()


def own_copy_engine() -> OwnCopyEngine:
    """Correct: decodes on its own copy, exposes a same-model ``target`` that never moves."""
    return OwnCopyEngine()


def oracle_only_engine() -> OracleOnlyEngine:
    """Correct: decodes on its own copy, exposes the model as ``oracle``."""
    return OracleOnlyEngine()


def greedy_only_engine() -> GreedyOnlyEngine:
    """Correct, black-box: no steps, only ``greedy()``."""
    return GreedyOnlyEngine()


def varying_k_engine() -> VaryingK:
    """Correct: a different k every round."""
    return VaryingK()


def lookup_drafter() -> LookupDrafter:
    """The drafters' correct control."""
    return LookupDrafter()


def zoo_target() -> ZooTarget:
    """The targets' correct control."""
    return ZooTarget()


def zoo_engine() -> ZooEngine:
    """The engines' correct control."""
    return ZooEngine()


def tree_zoo_engine() -> TreeZooEngine:
    """The tree engines' control: the zoo engine with the reference tree decoder (checkpoint rollback)."""
    return TreeZooEngine()


def tree_replay_engine() -> TreeReplayEngine:
    """Correct, differently: the tree decoder with replay rollback."""
    return TreeReplayEngine()


def tree_match_sampling_engine() -> TreeMatchSamplingEngine:
    """Correct, differently: sampled trees verified by sample-and-match traversal."""
    return TreeMatchSamplingEngine()


def batch_zoo_engine() -> BatchZooEngine:
    """The batched engines' control: the reference batched decoder (checkpoint rollback)."""
    return BatchZooEngine()


def batch_replay_engine() -> BatchReplayEngine:
    """Correct, differently: the batched decoder with replay rollback."""
    return BatchReplayEngine()


def batch_fifo_two_rows() -> BatchFifoTwoRows:
    """Correct, differently: two rows per verify step for three slots, and a FIFO free list."""
    return BatchFifoTwoRows()


def batch_recompute_only() -> BatchRecomputeOnly:
    """Correct, differently: preempts by recompute only (declares no snapshot preemption), replay rollback."""
    return BatchRecomputeOnly()


def batch_grammar_scratch_matchers() -> BatchScratchMatchers:
    """Correct, differently: each request's draft scanned on a copy of its own grammar matcher."""
    return BatchScratchMatchers()


def feature_head_drafter() -> HeadDrafter:
    """Correct: a feature head whose KV is append-only (the chain's slots are overwritten next call)."""
    return head_drafter()


def feature_head_replay() -> HeadDrafter:
    """Correct, differently: the head's chain slots are snapshotted and restored (replay-only rollback)."""
    return head_drafter(rollback="replay")


def feature_head_recomputes() -> HeadDrafter:
    """Correct, differently: ignores the handed features and computes them from the accepted context."""
    return head_drafter(HeadRecomputesFeatures)


def declared_prompt_only_lookup() -> DeclaredPromptOnlyLookup:
    """Correct: a prompt-only lookup that declares history_dependent = True."""
    return DeclaredPromptOnlyLookup()


def suffix_drafter() -> SuffixDrafter:
    """Correct: the shipped suffix drafter (learns across requests; declared)."""
    return SuffixDrafter()


def feature_head_reprefills() -> HeadDrafter:
    """Correct, differently: a feature head that keeps no head position between calls."""
    return head_drafter(HeadReprefills)


def feature_head_lazy_reset() -> HeadDrafter:
    """Correct, differently: a feature head whose reset() is lazy (the next call drops every held position)."""
    return head_drafter(HeadLazyReset)


def incremental_lookup() -> IncrementalLookup:
    """Correct: prompt lookup over an index kept between calls, cut back to the common prefix on every request."""
    return IncrementalLookup()


def session_lookup() -> SessionLookup:
    """Correct: a declared history-dependent lookup over the current and the earlier requests of a session."""
    return SessionLookup()


def feature_engine() -> FeatureZooEngine:
    """Correct: the feature engines' control (SpecDecoder and feature glue that changes nothing)."""
    return FeatureZooEngine()


def feature_engine_replay() -> FeatureZooEngine:
    """Correct, differently: replay rollback (the kept positions' features come from the replay forward)."""
    return FeatureZooEngine(rollback="replay")


def feature_session_engine() -> FeatureSessionEngine:
    """Correct: a prefix-caching session engine with a feature drafter, keeping its cached positions' rows."""
    return FeatureSessionEngine()


def sampling_engine() -> SamplingZooEngine:
    """Correct: samples by rejection sampling (checkpoint rollback), the sampling members' control."""
    return SamplingZooEngine()


def sampling_engine_match_replay() -> SamplingZooEngine:
    """Correct, differently: sample-and-match with replay rollback."""
    return SamplingZooEngine(scheme="match", rollback="replay")


def sampling_engine_own_q() -> SamplingZooEngine:
    """Correct, differently: drafts with its own sampling drafter and tests acceptance against its declared q."""
    return SamplingZooEngine(own_sampler=True)


def decode_zoo_engine() -> DecodeZooEngine:
    """The decode-state control: the reference decoder with DecodeParams (checkpoint rollback)."""
    return DecodeZooEngine()


def decode_replay_engine() -> DecodeReplayEngine:
    """Correct, differently: replay rollback under decode parameters."""
    return DecodeReplayEngine()


def decode_checkpointed_processors() -> CheckpointedProcessorsEngine:
    """Correct, differently: processors advanced in place through the draft, restored from a checkpoint."""
    return CheckpointedProcessorsEngine()


def grammar_scratch_matcher() -> ScratchMatcherEngine:
    """Correct, differently: each draft scanned on a copy of the grammar matcher instead of rolling it back."""
    return ScratchMatcherEngine()


def decode_float32_logprobs() -> Float32LogprobsEngine:
    """Correct, differently: logprobs computed in float32, within the contract's tolerance."""
    return Float32LogprobsEngine()


def decode_match_scheme() -> DecodeMatchEngine:
    """Correct, differently: sample-and-match acceptance under decode parameters."""
    return DecodeMatchEngine()


def decode_session_engine() -> DecodeSessionEngine:
    """Correct: the prefix-caching session engine taking decode parameters (``engine.session`` with
    ``--decode-state`` sends some of its requests with processors)."""
    return DecodeSessionEngine()


def session_penalty_buffer_cleared() -> SessionPenaltyBufferCleared:
    """Correct, differently: one session-long penalty buffer, cleared at the start of every request."""
    return SessionPenaltyBufferCleared()


def stop_string_tail_window() -> StopStringTailWindow:
    """Correct, differently: the stop-string matcher keeps only the longest string's length of text."""
    return StopStringTailWindow()


def prompt_logprobs_float32() -> PromptLogprobsFloat32:
    """Correct, differently: the prompt's logprobs computed in float32, within the contract's tolerance."""
    return PromptLogprobsFloat32()


def sampling_drafter() -> DraftSampler:
    """Correct: a sampling drafter whose declared q is the distribution it draws from."""
    return DraftSampler()


# ---------------------------------------------------------------------------- the members

# name -> (kind, implementation[, factory]): the zoo's one list of member names. Each name is also the
# member's plug-in factory, ``specproof.conformance.zoo:<name>`` (``__getattr__`` below), which calls
# ``factory`` (default: the implementation class) with no argument. Which invariant rejects each member,
# and which others its bug also trips, is the registry's to say (``Invariant.zoo`` / ``Invariant.also``):
# no id is spelled here.
_MEMBERS: dict[str, MemberEntry] = {
    "too_long": ("drafter", TooLong),
    "out_of_range": ("drafter", OutOfRange),
    "nondeterministic": ("drafter", Nondeterministic),
    "mutates_input": ("drafter", MutatesInput),
    "sticky_cache": ("drafter", StickyCache),
    "match_pointer": ("drafter", MatchPointer),
    "returns_generator": ("drafter", ReturnsGenerator),
    "reads_past_context": ("drafter", ReadsPastContext),
    "model_drafter_no_rollback": ("drafter", DraftNoRollback, _model_drafters.model_drafter_no_rollback),
    "model_drafter_kv_only_rollback": ("drafter", DraftKVOnlyRollback, _model_drafters.model_drafter_kv_only_rollback),
    "model_drafter_kv_only_rollback_gdn": (
        "drafter",
        DraftKVOnlyRollback,
        _model_drafters.model_drafter_kv_only_rollback_gdn,
    ),
    "model_drafter_reset_keeps_state": (
        "drafter",
        DraftResetKeepsModel,
        _model_drafters.model_drafter_reset_keeps_state,
    ),
    "pads_vocab": ("target", PadsVocab),
    "processed_is_last_index": ("target", ProcessedIsLastIndex),
    "chunked_forward_differs": ("target", ChunkedForwardDiffers),
    "mask_leaks_next_token": ("target", MaskLeaksNextToken),
    "restore_forgets_conv": ("target", RestoreForgetsConv),
    "restore_forgets_rec": ("target", RestoreForgetsRec),
    "capacity_wraps": ("target", CapacityWraps),
    "checkpoints_off_by_one": ("target", CheckpointsOffByOne),
    "reset_keeps_conv": ("target", ResetKeepsConv),
    "drifts_from_source": ("target", DriftsFromSource),
    "forgets_recurrent_restore": ("engine", ForgetsRecurrentRestore),
    "processed_off_by_one": ("engine", ProcessedOffByOne),
    "accepts_past_mismatch": ("engine", AcceptsPastMismatch),
    "drops_bonus_token": ("engine", DropsBonusToken),
    "drafts_past_k": ("engine", DraftsPastK),
    "emits_after_eos": ("engine", EmitsAfterEos),
    "stale_state_after_zero_draft": ("engine", StaleStateAfterZeroDraft),
    **{name: ("engine", cls) for name, cls in TREE_MEMBERS.items()},
    **{name: ("drafter", cls) for name, cls in TREE_DRAFTER_MEMBERS.items()},
    **{name: ("engine", cls) for name, cls in TREE_SAMPLING_MEMBERS.items()},
    **{name: ("engine", cls) for name, cls in STOP_STRING_MEMBERS.items()},
    **{name: ("engine", cls) for name, cls in PROMPT_LOGPROB_MEMBERS.items()},
    **{name: ("engine", cls) for name, cls in DECODE_CASE_MEMBERS.items()},
    "batch_stale_zero_draft": ("engine", BatchStaleZeroDraft),
    "batch_pads_recurrent_state": ("engine", BatchPadsRecurrentState),
    "batch_slot_not_cleared": ("engine", BatchSlotNotCleared),
    "batch_rollback_wrong_slot": ("engine", BatchRollbackWrongSlot),
    "batch_stale_resume": ("engine", BatchStaleResume),
    "batch_retries_rejected_row": ("engine", BatchRetriesRejectedRow),
    "batch_verify_depends_on_batch_size": ("engine", BatchVerifyDependsOnBatchSize),
    "batch_one_rng_stream": ("engine", BatchOneRngStream),
    "batch_seed_ignored_beside_unseeded": ("engine", BatchSeedIgnoredBesideUnseeded),
    "batch_temperature_from_first_row": ("engine", BatchTemperatureFromFirstRow),
    "batch_shared_penalty_buffer": ("engine", BatchSharedPenaltyBuffer),
    "refeeds_accepted_first": ("engine", RefeedsAcceptedFirst),
    "eos_masked_by_length_cap": ("engine", EosMaskedByLengthCap),
    "ignores_suite_drafts": ("engine", IgnoresSuiteDrafts),
    "verifies_own_draft": ("engine", VerifiesOwnDraft),
    "trusts_overlong_draft": ("engine", TrustsOverlongDraft),
    "raises_every_call": ("engine", RaisesEveryCall),
    "replays_despite_checkpoints": ("engine", ReplaysDespiteCheckpoints),
    "drops_last_step_at_eos": ("engine", DropsLastStepAtEos),
    "stale_prefix_cache": ("engine", StalePrefixCache),
    "snapshot_only_last_call": ("engine", SnapshotOnlyLastCall),
    "never_reuses_prefix": ("engine", NeverReusesPrefix),
    "overclaims_prefix_reuse": ("engine", OverclaimsPrefixReuse),
    "length_cap_hides_eos_in_block": ("engine", LengthCapHidesEosInBlock),
    "prompt_only_lookup": ("drafter", PromptOnlyLookup),
    "head_keeps_chain": ("drafter", HeadKeepsChain, lambda: head_drafter(HeadKeepsChain)),
    "head_keeps_chain_after_full_accept": (
        "drafter",
        HeadKeepsChainAfterFullAccept,
        lambda: head_drafter(HeadKeepsChainAfterFullAccept),
    ),
    "head_lazy_reset_keeps_longer": (
        "drafter",
        HeadLazyResetKeepsLonger,
        lambda: head_drafter(HeadLazyResetKeepsLonger),
    ),
    "raises_on_shorter_request": ("drafter", RaisesOnShorterRequest),
    "mutates_on_later_request": ("drafter", MutatesOnLaterRequest),
    "feature_from_rejected": ("engine", FeatureFromRejected),
    "features_shifted": ("engine", FeaturesShifted),
    "features_wrong_layer": ("engine", FeaturesWrongLayer),
    "features_stale_across_requests": ("engine", FeaturesStaleAcrossRequests),
    "prefix_hit_zero_features": ("engine", PrefixHitZeroFeatures),
    "prefix_hit_stale_features": ("engine", PrefixHitStaleFeatures),
    "argmax_verification": ("engine", ArgmaxVerification),
    "residual_from_p": ("engine", ResidualFromP),
    "unnormalized_residual": ("engine", UnnormalizedResidual),
    "bonus_from_wrong_row": ("engine", BonusFromWrongRow),
    "unfiltered_sampling": ("engine", UnfilteredSampling),
    "shared_rng_stream": ("engine", SharedRngStream),
    "broadcast_seed": ("engine", BroadcastSeed),
    "q_of_next_position": ("engine", QOfNextPosition),
    "greedy_limit_samples": ("engine", GreedyLimitSamples),
    "sampled_counts_replacement": ("engine", SampledCountsReplacement),
    "samples_padded_vocab": ("engine", SamplesPaddedVocab),
    "unseeded_drafter_rng": ("engine", UnseededDrafterRng),
    "bonus_after_accepted_eos": ("engine", BonusAfterAcceptedEos),
    "matches_argmax_at_last_position": ("engine", MatchesArgmaxAtLastPosition),
    "drafter_ignores_rng": ("drafter", DrafterIgnoresRng),
    "leaks_placeholder_id": ("engine", LeaksPlaceholderId),
    "q_from_raw_logits": ("drafter", QFromRawLogits),
    "depth_grows_over_requests": ("drafter", DepthGrowsOverRequests),
    "draft_cache_ignores_k": ("drafter", DraftCacheIgnoresK),
    "reset_keeps_index_pointer": ("drafter", ResetKeepsIndexPointer),
    "early_edit_keeps_index": ("drafter", EarlyEditKeepsIndex),
    "block_cache_without_prefix": ("engine", BlockCacheWithoutPrefix),
    "penalty_from_last_token": ("engine", PenaltyFromLastToken),
    "penalties_ignored_when_drafting": ("engine", PenaltiesIgnoredWhenDrafting),
    "logit_bias_ignored_when_drafting": ("engine", LogitBiasIgnoredWhenDrafting),
    "min_tokens_extra_row": ("engine", MinTokensExtraRow),
    "penalty_buffer_keeps_rejected": ("engine", PenaltyBufferKeepsRejected),
    "stop_missed_inside_block": ("engine", StopMissedInsideBlock),
    "grammar_mask_first_row_only": ("engine", GrammarMaskFirstRowOnly),
    "grammar_not_rolled_back": ("engine", GrammarNotRolledBack),
    "grammar_one_behind_after_block": ("engine", GrammarOneBehindAfterBlock),
    "grammar_off_when_delimiter_in_block": ("engine", GrammarOffWhenDelimiterInBlock),
    "grammar_terminated_advanced": ("engine", GrammarTerminatedAdvanced),
    "logprobs_from_drafter": ("engine", LogprobsFromDrafter),
    "logprobs_wrong_row": ("engine", LogprobsWrongRow),
    "logprobs_before_processors": ("engine", LogprobsBeforeProcessors),
    "logprobs_past_stop": ("engine", LogprobsPastStop),
    "frequency_penalty_ignored": ("engine", FrequencyPenaltyIgnored),
    "penalty_counts_carried_over": ("engine", PenaltyCountsCarriedOver),
    "output_carried_over": ("engine", OutputCarriedOver),
    "session_penalties_carried_over": ("engine", SessionPenaltiesCarriedOver),
    "stop_string_missed_across_rounds": ("engine", StopStringMissedAcrossRounds),
    "penalties_skipped_when_sampling": ("engine", PenaltiesSkippedWhenSampling),
    "grammar_unmasked_residual_when_sampling": ("engine", GrammarUnmaskedResidualWhenSampling),
    "grammar_follows_argmax_when_sampling": ("engine", GrammarFollowsArgmaxWhenSampling),
    "batch_shared_grammar_matcher": ("engine", BatchSharedGrammarMatcher),
    "batch_grammar_rollback_wrong_request": ("engine", BatchGrammarRollbackWrongRequest),
}


# members that take a randomized search to find (a ``--seed``, a ``specproof fuzz`` campaign): the
# derandomized quick profile is not promised to reject them; the example database replays them after
_FOUND_BY_SEARCH: frozenset[str] = frozenset()  # members only a randomized search finds
# members whose deviation is below the quick profile's sensitivity (a TV of 0.2): ci rejects them
# (matches_argmax_at_last_position: its deviation lives at the last slot of full blocks, a quarter of rounds)
_FOUND_AT_CI: frozenset[str] = frozenset({"q_of_next_position", "matches_argmax_at_last_position"})


class ZooRegistryError(ValueError):
    """The zoo and the registry disagree: a member no invariant claims, or a claim on no member."""


def build_zoo(members: Mapping[str, MemberEntry], invariants: Iterable[Invariant] = REGISTRY) -> dict[str, ZooMember]:
    """Every member with the invariant that claims it (``Invariant.zoo``) and those that list it in ``also``.

    Raises ``ZooRegistryError`` naming the member or the invariant when a member is claimed by no
    invariant or by two, or when an invariant names a member the zoo lacks.
    """
    invariants = tuple(invariants)
    claimed: dict[str, str] = {}
    for inv in invariants:
        for name in (*inv.zoo, *inv.also):
            if name not in members:
                raise ZooRegistryError(f"invariant {inv.id} names zoo member {name!r}, which the zoo does not have")
        for name in inv.zoo:
            if name in claimed:
                raise ZooRegistryError(f"zoo member {name!r} is claimed by both {claimed[name]} and {inv.id}")
            claimed[name] = inv.id
    unclaimed = sorted(set(members) - set(claimed))
    if unclaimed:
        raise ZooRegistryError(f"zoo members {unclaimed} are claimed by no invariant (Invariant.zoo)")
    zoo: dict[str, ZooMember] = {}
    for name, entry in members.items():
        kind, implementation = entry[0], entry[1]
        invariant = claimed[name]
        # the description is the first line of the class docstring, less its "invariant-id: " prefix
        doc = (implementation.__doc__ or "").strip().splitlines()[0]
        zoo[name] = ZooMember(
            name=name,
            kind=kind,
            invariant=invariant,
            description=doc.split(": ", 1)[-1] if doc.startswith(f"``{invariant}``") else doc,
            spec=f"{_MODULE}:{name}",
            implementation=implementation,
            also=tuple(inv.id for inv in invariants if name in inv.also and inv.id != invariant),
            found_by="search" if name in _FOUND_BY_SEARCH else "ci" if name in _FOUND_AT_CI else "quick",
        )
    return zoo


ZOO: dict[str, ZooMember] = build_zoo(_MEMBERS)

CORRECT: dict[str, str] = {
    name: f"{_MODULE}:{name}"
    for name in (
        "own_copy_engine",
        "oracle_only_engine",
        "greedy_only_engine",
        "varying_k_engine",
        "session_engine",
        "session_engine_replay",
        "varying_k_session_engine",
        "greedy_only_session_engine",
        "continuation_only_session_engine",
        "feature_engine",
        "feature_engine_replay",
        "feature_session_engine",
        "own_drafts_engine",
        "sampling_engine",
        "sampling_engine_match_replay",
        "sampling_engine_own_q",
    )
}
"""Correct engines that differ from the control in what they expose or how they draft: certification accepts them."""

CORRECT_DRAFTERS: dict[str, str] = {
    name: f"{_MODULE}:{name}"
    for name in (
        "model_drafter_checkpoint",
        "model_drafter_replay",
        "model_drafter_reprefill",
        "feature_head_drafter",
        "feature_head_replay",
        "feature_head_recomputes",
        "feature_head_reprefills",
        "feature_head_lazy_reset",
        "session_lookup",
        "incremental_lookup",
        "declared_prompt_only_lookup",
        "suffix_drafter",
        "sampling_drafter",
        "tree_drafter",
        "dynamic_tree_drafter",
        "ngram_tree_drafter",
    )
}
"""Correct drafters that keep a draft model (checkpoint, replay or no rollback): certification accepts them."""

CORRECT_BATCH: dict[str, str] = {
    name: f"{_MODULE}:{name}"
    for name in (
        "batch_zoo_engine",
        "batch_replay_engine",
        "batch_fifo_two_rows",
        "batch_recompute_only",
        "batch_grammar_scratch_matchers",
    )
}
"""Correct batched engines (the control, replay rollback, two rows a step with a FIFO free list, preemption
by recompute only, grammar drafts scanned on a copy of each matcher): the batch checks accept them
(docs/contract.md, "Batches")."""

NEEDS_DECODE_STATE: frozenset[str] = frozenset({*DECODE_CASE_MEMBERS, "session_penalties_carried_over"})
"""Members of engine-case and session invariants found only where the search and the session machine draw decode
parameters (``--decode-state``)."""

CORRECT_DECODE: dict[str, str] = {
    name: f"{_MODULE}:{name}"
    for name in (
        "decode_zoo_engine",
        "decode_replay_engine",
        "decode_checkpointed_processors",
        "grammar_scratch_matcher",
        "decode_float32_logprobs",
        "decode_match_scheme",
        "session_penalty_buffer_cleared",
        "stop_string_tail_window",
        "prompt_logprobs_float32",
    )
}
"""Correct engines under decode parameters (the control, replay rollback, processors restored from a checkpoint):
the decode-state checks accept them (docs/contract.md, "Decode state")."""
CORRECT_TREE: dict[str, str] = {name: f"{_MODULE}:{name}" for name in ("tree_zoo_engine", "tree_replay_engine")}
"""Correct tree engines (the control, replay rollback): the tree checks accept them, with trees and with a
chain declared as a tree (docs/contract.md, "Trees")."""
CORRECT_TREE_SAMPLING: dict[str, str] = {
    name: f"{_MODULE}:{name}" for name in ("tree_zoo_engine", "tree_replay_engine", "tree_match_sampling_engine")
}
"""Correct sampled tree engines (recursive rejection sampling with both rollbacks; sample-and-match traversal):
``tree.sampled-distribution`` accepts them (docs/contract.md, "Sampled trees")."""

CONTROLS: dict[Kind, str] = {
    "drafter": f"{_MODULE}:lookup_drafter",
    "target": f"{_MODULE}:zoo_target",
    "engine": f"{_MODULE}:zoo_engine",
}
"""The correct control of each family, as a plug-in spec: certification accepts these."""


# ---------------------------------------------------------------------------- the members' factories


def _member_factory(name: str, entry: MemberEntry) -> Callable[[], object]:
    make: Callable[[], object] = entry[2] if len(entry) == 3 else entry[1]

    def factory() -> object:
        return make()

    factory.__name__ = factory.__qualname__ = name
    factory.__module__ = _MODULE
    factory.__doc__ = f"A fresh ``{entry[1].__name__}``: the zoo member {name!r} ({ZOO[name].invariant})."
    return factory


_FACTORIES: dict[str, Callable[[], object]] = {name: _member_factory(name, entry) for name, entry in _MEMBERS.items()}


def __getattr__(name: str) -> Callable[[], object]:
    """``specproof.conformance.zoo.<member>``: the member's zero-argument factory (its plug-in)."""
    try:
        return _FACTORIES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACTORIES})


# derived: the members come from _MEMBERS, the correct implementations from the tables above
__all__ = [
    "CONTROLS",
    "CORRECT_BATCH",
    "CORRECT_DECODE",
    "NEEDS_DECODE_STATE",
    "CORRECT_TREE",
    "CORRECT_TREE_SAMPLING",
    "CORRECT",
    "CORRECT_DRAFTERS",
    "ZOO",
    "ZOO_CONFIG",
    "ZooMember",
    "ZooRegistryError",
    "build_zoo",
    "small_reference",
    *_MEMBERS,
    *CORRECT,
    *CORRECT_DRAFTERS,
    *CORRECT_BATCH,
    *CORRECT_DECODE,
    *CORRECT_TREE,
    "tree_match_sampling_engine",
    *(spec.rsplit(":", 1)[1] for spec in CONTROLS.values()),
]
