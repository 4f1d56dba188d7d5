"""specproof.conformance.zoo: deliberately broken implementations the suite must reject.

Every member breaks exactly one invariant of the catalogue, the way a real engine,
drafter or model export once did. Each is a plug-in (``specproof.conformance.zoo:<name>``,
a zero-argument factory), so it is certified through the ordinary paths::

    specproof certify engine --engine specproof.conformance.zoo:drops_bonus_token
    specproof certify target --target specproof.conformance.zoo:restore_forgets_conv

and ``ZOO`` says, per member, what kind of subject it is, which invariant it breaks
(and which others the same bug is also caught by), and what the bug is. The
meta-tests (``tests/test_zoo.py``) certify every member and require the named
invariant to fail.

Each family also has its correct *control* (``lookup_drafter``, ``zoo_target``,
``zoo_engine``): the same code with no bug, which certification accepts, so a
member's failure is due to its one change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Literal

import attrs

from specproof.conformance._registry import REGISTRY, Invariant
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
from specproof.conformance.zoo._history_drafters import DeclaredPromptOnlyLookup, PromptOnlyLookup
from specproof.conformance.zoo._model_drafters import (
    DraftKVOnlyRollback,
    DraftNoRollback,
    DraftResetKeepsModel,
    model_drafter_checkpoint,
    model_drafter_kv_only_rollback,
    model_drafter_kv_only_rollback_gdn,
    model_drafter_no_rollback,
    model_drafter_replay,
    model_drafter_reprefill,
    model_drafter_reset_keeps_state,
)
from specproof.conformance.zoo._session_engines import (
    NeverReusesPrefix,
    OverclaimsPrefixReuse,
    SnapshotOnlyLastCall,
    StalePrefixCache,
    continuation_only_session_engine,
    greedy_only_session_engine,
    never_reuses_prefix,
    overclaims_prefix_reuse,
    session_engine,
    session_engine_replay,
    snapshot_only_last_call,
    stale_prefix_cache,
    varying_k_session_engine,
)
from specproof.conformance.zoo._targets import (
    ZOO_CONFIG,
    CapacityWraps,
    CheckpointsOffByOne,
    ChunkedForwardDiffers,
    MaskLeaksNextToken,
    PadsVocab,
    ProcessedIsLastIndex,
    ResetKeepsConv,
    RestoreForgetsConv,
    RestoreForgetsRec,
    ZooTarget,
    small_reference,
)
from specproof.engine.drafters.suffix import SuffixDrafter

__all__ = [
    "CONTROLS",
    "CORRECT",
    "CORRECT_DRAFTERS",
    "ZOO",
    "ZOO_CONFIG",
    "ZooMember",
    "ZooRegistryError",
    "build_zoo",
    "drafts_past_k",
    "drops_last_step_at_eos",
    "mask_leaks_next_token",
    "pads_vocab",
    "processed_is_last_index",
    "replays_despite_checkpoints",
    "reset_keeps_conv",
    "accepts_past_mismatch",
    "capacity_wraps",
    "checkpoints_off_by_one",
    "chunked_forward_differs",
    "drops_bonus_token",
    "emits_after_eos",
    "eos_masked_by_length_cap",
    "greedy_only_engine",
    "length_cap_hides_eos_in_block",
    "greedy_only_session_engine",
    "continuation_only_session_engine",
    "ignores_suite_drafts",
    "never_reuses_prefix",
    "overclaims_prefix_reuse",
    "match_pointer",
    "model_drafter_checkpoint",
    "model_drafter_kv_only_rollback",
    "model_drafter_kv_only_rollback_gdn",
    "model_drafter_no_rollback",
    "model_drafter_replay",
    "model_drafter_reprefill",
    "model_drafter_reset_keeps_state",
    "oracle_only_engine",
    "own_copy_engine",
    "own_drafts_engine",
    "raises_every_call",
    "reads_past_context",
    "refeeds_accepted_first",
    "returns_generator",
    "session_engine",
    "session_engine_replay",
    "snapshot_only_last_call",
    "stale_prefix_cache",
    "sticky_cache",
    "varying_k_engine",
    "varying_k_session_engine",
    "forgets_recurrent_restore",
    "lookup_drafter",
    "mutates_input",
    "nondeterministic",
    "out_of_range",
    "processed_off_by_one",
    "restore_forgets_conv",
    "restore_forgets_rec",
    "small_reference",
    "stale_state_after_zero_draft",
    "too_long",
    "trusts_overlong_draft",
    "verifies_own_draft",
    "zoo_engine",
    "zoo_target",
]

Kind = Literal["drafter", "target", "engine"]
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
    found_by: Literal["quick", "search"] = "quick"

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


def too_long() -> TooLong:
    return TooLong()


def out_of_range() -> OutOfRange:
    return OutOfRange()


def nondeterministic() -> Nondeterministic:
    return Nondeterministic()


def mutates_input() -> MutatesInput:
    return MutatesInput()


def chunked_forward_differs() -> ChunkedForwardDiffers:
    return ChunkedForwardDiffers()


def restore_forgets_conv() -> RestoreForgetsConv:
    return RestoreForgetsConv()


def restore_forgets_rec() -> RestoreForgetsRec:
    return RestoreForgetsRec()


def capacity_wraps() -> CapacityWraps:
    return CapacityWraps()


def checkpoints_off_by_one() -> CheckpointsOffByOne:
    return CheckpointsOffByOne()


def pads_vocab() -> PadsVocab:
    return PadsVocab()


def processed_is_last_index() -> ProcessedIsLastIndex:
    return ProcessedIsLastIndex()


def mask_leaks_next_token() -> MaskLeaksNextToken:
    return MaskLeaksNextToken()


def reset_keeps_conv() -> ResetKeepsConv:
    return ResetKeepsConv()


def drafts_past_k() -> DraftsPastK:
    return DraftsPastK()


def replays_despite_checkpoints() -> ReplaysDespiteCheckpoints:
    return ReplaysDespiteCheckpoints()


def drops_last_step_at_eos() -> DropsLastStepAtEos:
    return DropsLastStepAtEos()


def forgets_recurrent_restore() -> ForgetsRecurrentRestore:
    return ForgetsRecurrentRestore()


def processed_off_by_one() -> ProcessedOffByOne:
    return ProcessedOffByOne()


def accepts_past_mismatch() -> AcceptsPastMismatch:
    return AcceptsPastMismatch()


def drops_bonus_token() -> DropsBonusToken:
    return DropsBonusToken()


def emits_after_eos() -> EmitsAfterEos:
    return EmitsAfterEos()


def stale_state_after_zero_draft() -> StaleStateAfterZeroDraft:
    return StaleStateAfterZeroDraft()


def sticky_cache() -> StickyCache:
    return StickyCache()


def match_pointer() -> MatchPointer:
    return MatchPointer()


def returns_generator() -> ReturnsGenerator:
    return ReturnsGenerator()


def reads_past_context() -> ReadsPastContext:
    return ReadsPastContext()


def refeeds_accepted_first() -> RefeedsAcceptedFirst:
    return RefeedsAcceptedFirst()


def eos_masked_by_length_cap() -> EosMaskedByLengthCap:
    return EosMaskedByLengthCap()


def length_cap_hides_eos_in_block() -> LengthCapHidesEosInBlock:
    return LengthCapHidesEosInBlock()


def raises_every_call() -> RaisesEveryCall:
    return RaisesEveryCall()


def ignores_suite_drafts() -> IgnoresSuiteDrafts:
    return IgnoresSuiteDrafts()


def verifies_own_draft() -> VerifiesOwnDraft:
    return VerifiesOwnDraft()


def trusts_overlong_draft() -> TrustsOverlongDraft:
    return TrustsOverlongDraft()


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


def head_keeps_chain() -> HeadDrafter:
    return head_drafter(HeadKeepsChain)


def feature_from_rejected() -> FeatureFromRejected:
    return FeatureFromRejected()


def features_shifted() -> FeaturesShifted:
    return FeaturesShifted()


def features_wrong_layer() -> FeaturesWrongLayer:
    return FeaturesWrongLayer()


def features_stale_across_requests() -> FeaturesStaleAcrossRequests:
    return FeaturesStaleAcrossRequests()


def feature_head_drafter() -> HeadDrafter:
    """Correct: a feature head whose KV is append-only (the chain's slots are overwritten next call)."""
    return head_drafter()


def feature_head_replay() -> HeadDrafter:
    """Correct, differently: the head's chain slots are snapshotted and restored (replay-only rollback)."""
    return head_drafter(rollback="replay")


def feature_head_recomputes() -> HeadDrafter:
    """Correct, differently: ignores the handed features and computes them from the accepted context."""
    return head_drafter(HeadRecomputesFeatures)


def prompt_only_lookup() -> PromptOnlyLookup:
    return PromptOnlyLookup()


def declared_prompt_only_lookup() -> DeclaredPromptOnlyLookup:
    """Correct: a prompt-only lookup that declares history_dependent = True."""
    return DeclaredPromptOnlyLookup()


def suffix_drafter() -> SuffixDrafter:
    """Correct: the shipped suffix drafter (learns across requests; declared)."""
    return SuffixDrafter()


def feature_engine() -> FeatureZooEngine:
    """Correct: the feature engines' control (SpecDecoder and feature glue that changes nothing)."""
    return FeatureZooEngine()


def feature_engine_replay() -> FeatureZooEngine:
    """Correct, differently: replay rollback (the kept positions' features come from the replay forward)."""
    return FeatureZooEngine(rollback="replay")


# ---------------------------------------------------------------------------- the members

# name -> (kind, implementation). Which invariant rejects each member, and which others its bug
# also trips, is the registry's to say (``Invariant.zoo`` / ``Invariant.also``): no id is spelled here.
_MEMBERS: dict[str, tuple[Kind, type]] = {
    "too_long": ("drafter", TooLong),
    "out_of_range": ("drafter", OutOfRange),
    "nondeterministic": ("drafter", Nondeterministic),
    "mutates_input": ("drafter", MutatesInput),
    "sticky_cache": ("drafter", StickyCache),
    "match_pointer": ("drafter", MatchPointer),
    "returns_generator": ("drafter", ReturnsGenerator),
    "reads_past_context": ("drafter", ReadsPastContext),
    "model_drafter_no_rollback": ("drafter", DraftNoRollback),
    "model_drafter_kv_only_rollback": ("drafter", DraftKVOnlyRollback),
    "model_drafter_kv_only_rollback_gdn": ("drafter", DraftKVOnlyRollback),
    "model_drafter_reset_keeps_state": ("drafter", DraftResetKeepsModel),
    "pads_vocab": ("target", PadsVocab),
    "processed_is_last_index": ("target", ProcessedIsLastIndex),
    "chunked_forward_differs": ("target", ChunkedForwardDiffers),
    "mask_leaks_next_token": ("target", MaskLeaksNextToken),
    "restore_forgets_conv": ("target", RestoreForgetsConv),
    "restore_forgets_rec": ("target", RestoreForgetsRec),
    "capacity_wraps": ("target", CapacityWraps),
    "checkpoints_off_by_one": ("target", CheckpointsOffByOne),
    "reset_keeps_conv": ("target", ResetKeepsConv),
    "forgets_recurrent_restore": ("engine", ForgetsRecurrentRestore),
    "processed_off_by_one": ("engine", ProcessedOffByOne),
    "accepts_past_mismatch": ("engine", AcceptsPastMismatch),
    "drops_bonus_token": ("engine", DropsBonusToken),
    "drafts_past_k": ("engine", DraftsPastK),
    "emits_after_eos": ("engine", EmitsAfterEos),
    "stale_state_after_zero_draft": ("engine", StaleStateAfterZeroDraft),
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
    "head_keeps_chain": ("drafter", HeadKeepsChain),
    "feature_from_rejected": ("engine", FeatureFromRejected),
    "features_shifted": ("engine", FeaturesShifted),
    "features_wrong_layer": ("engine", FeaturesWrongLayer),
    "features_stale_across_requests": ("engine", FeaturesStaleAcrossRequests),
}


# members that take a randomized search to find (a ``--seed``, a ``specproof fuzz`` campaign): the
# derandomized quick profile is not promised to reject them; the example database replays them after
_FOUND_BY_SEARCH: frozenset[str] = frozenset()  # members only a randomized search finds


class ZooRegistryError(ValueError):
    """The zoo and the registry disagree: a member no invariant claims, or a claim on no member."""


def build_zoo(
    members: Mapping[str, tuple[Kind, type]], invariants: Iterable[Invariant] = REGISTRY
) -> dict[str, ZooMember]:
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
    for name, (kind, implementation) in members.items():
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
            found_by="search" if name in _FOUND_BY_SEARCH else "quick",
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
        "own_drafts_engine",
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
        "declared_prompt_only_lookup",
        "suffix_drafter",
    )
}
"""Correct drafters that keep a draft model (checkpoint, replay or no rollback): certification accepts them."""

CONTROLS: dict[Kind, str] = {
    "drafter": f"{_MODULE}:lookup_drafter",
    "target": f"{_MODULE}:zoo_target",
    "engine": f"{_MODULE}:zoo_engine",
}
"""The correct control of each family, as a plug-in spec: certification accepts these."""
