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

from collections.abc import Iterator
from typing import Literal

import attrs

from specproof.conformance._registry import REGISTRY
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
    DropsBonusToken,
    EmitsAfterEos,
    EosMaskedByLengthCap,
    ForgetsRecurrentRestore,
    GreedyOnlyEngine,
    LengthCapHidesEosInBlock,
    OracleOnlyEngine,
    OwnCopyEngine,
    ProcessedOffByOne,
    RaisesEveryCall,
    RefeedsAcceptedFirst,
    StaleStateAfterZeroDraft,
    VaryingK,
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
    SnapshotOnlyLastCall,
    StalePrefixCache,
    greedy_only_session_engine,
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


# ---------------------------------------------------------------------------- the registry


def _member(
    name: str,
    kind: Kind,
    implementation: type,
    invariant: str,
    also: tuple[str, ...] = (),
    found_by: Literal["quick", "search"] = "quick",
) -> ZooMember:
    # the description is the first line of the class docstring, less its "invariant-id: " prefix
    doc = (implementation.__doc__ or "").strip().splitlines()[0]
    if kind == "engine" and "engine.lossless" in (invariant, *also) and invariant != "engine.session":
        also = (*also, "engine.session")  # a bug that changes the tokens fails every request of a session too
    return ZooMember(
        name=name,
        kind=kind,
        invariant=invariant,
        description=doc.split(": ", 1)[-1] if doc.startswith(f"``{invariant}``") else doc,
        spec=f"{_MODULE}:{name}",
        implementation=implementation,
        also=also,
        found_by=found_by,
    )


# When the built-in engine meets a contract breach it raises (DrafterContractError, a wrong
# ``processed``); the harness then reports that run as a failure of every engine invariant.
_ENGINE_RAISES = (
    "engine.lossless",
    "engine.accept-bounds",
    "engine.accept-rule",
    "engine.kv-length",
    "engine.state-restored",
    "engine.stop",
    "engine.cost",
    "trace.consistency",
)
# A wrong restore also spoils the checks that use restore to probe something else.
_RESTORE_USERS = ("target.checkpoints", "target.capacity", "engine.lossless", "engine.state-restored")

ZOO: dict[str, ZooMember] = {
    m.name: m
    for m in (
        _member("too_long", "drafter", TooLong, "drafter.max-length", also=_ENGINE_RAISES),
        _member("out_of_range", "drafter", OutOfRange, "drafter.token-range", also=_ENGINE_RAISES),
        _member("nondeterministic", "drafter", Nondeterministic, "drafter.deterministic"),
        _member("mutates_input", "drafter", MutatesInput, "drafter.no-mutation"),
        _member(
            "chunked_forward_differs",
            "target",
            ChunkedForwardDiffers,
            "target.chunk-invariance",
            also=("engine.lossless",),
        ),
        _member(
            "restore_forgets_conv",
            "target",
            RestoreForgetsConv,
            "target.restore",
            also=_RESTORE_USERS,
        ),
        _member(
            "restore_forgets_rec",
            "target",
            RestoreForgetsRec,
            "target.restore",
            also=_RESTORE_USERS,
        ),
        _member("capacity_wraps", "target", CapacityWraps, "target.capacity"),
        _member(
            "checkpoints_off_by_one",
            "target",
            CheckpointsOffByOne,
            "target.checkpoints",
            also=_ENGINE_RAISES,
        ),
        _member(
            "forgets_recurrent_restore",
            "engine",
            ForgetsRecurrentRestore,
            "engine.state-restored",
            also=("engine.lossless",),
        ),
        _member(
            "processed_off_by_one",
            "engine",
            ProcessedOffByOne,
            "engine.kv-length",
            also=("engine.lossless", "engine.state-restored"),
        ),
        _member(
            "accepts_past_mismatch", "engine", AcceptsPastMismatch, "engine.accept-rule", also=("engine.lossless",)
        ),
        _member("drops_bonus_token", "engine", DropsBonusToken, "engine.accept-rule"),
        _member(
            "emits_after_eos", "engine", EmitsAfterEos, "engine.stop", also=("engine.lossless", "trace.consistency")
        ),
        _member(
            "stale_state_after_zero_draft",
            "engine",
            StaleStateAfterZeroDraft,
            "engine.lossless",
            also=("engine.state-restored",),
        ),
        _member("sticky_cache", "drafter", StickyCache, "drafter.deterministic"),
        _member("match_pointer", "drafter", MatchPointer, "drafter.deterministic"),
        _member(
            "returns_generator",
            "drafter",
            ReturnsGenerator,
            "drafter.token-range",
            also=("drafter.max-length", *_ENGINE_RAISES),
        ),
        _member("reads_past_context", "drafter", ReadsPastContext, "drafter.deterministic"),
        _member(
            "refeeds_accepted_first",
            "engine",
            RefeedsAcceptedFirst,
            "engine.state-restored",
            also=("engine.lossless",),
        ),
        _member(
            "eos_masked_by_length_cap",
            "engine",
            EosMaskedByLengthCap,
            "engine.stop",
            also=("engine.lossless", "trace.consistency"),
        ),
        _member(
            "length_cap_hides_eos_in_block",
            "engine",
            LengthCapHidesEosInBlock,
            "engine.stop",
            also=("engine.lossless", "trace.consistency"),
            found_by="search",
        ),
        _member("raises_every_call", "engine", RaisesEveryCall, "engine.lossless"),
        _member("stale_prefix_cache", "engine", StalePrefixCache, "engine.session"),
        _member("model_drafter_no_rollback", "drafter", DraftNoRollback, "drafter.deterministic"),
        _member("model_drafter_kv_only_rollback", "drafter", DraftKVOnlyRollback, "drafter.deterministic"),
        _member("model_drafter_kv_only_rollback_gdn", "drafter", DraftKVOnlyRollback, "drafter.deterministic"),
        _member("model_drafter_reset_keeps_state", "drafter", DraftResetKeepsModel, "drafter.deterministic"),
        _member("snapshot_only_last_call", "engine", SnapshotOnlyLastCall, "engine.session"),
        _member("prompt_only_lookup", "drafter", PromptOnlyLookup, "drafter.deterministic"),
        _member("head_keeps_chain", "drafter", HeadKeepsChain, "drafter.features", also=("drafter.deterministic",)),
        _member("feature_from_rejected", "engine", FeatureFromRejected, "engine.features"),
        _member("features_shifted", "engine", FeaturesShifted, "engine.features"),
        _member("features_wrong_layer", "engine", FeaturesWrongLayer, "engine.features"),
        _member("features_stale_across_requests", "engine", FeaturesStaleAcrossRequests, "engine.features"),
    )
}

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
        "feature_engine",
        "feature_engine_replay",
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
