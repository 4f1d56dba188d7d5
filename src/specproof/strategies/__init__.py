"""specproof.strategies: Hypothesis strategies and a stateful fuzzer for speculative decoding.

- ``contexts(vocab_size, *, min_size, max_size, kinds)``: adversarial token contexts
  (constant runs, periodic, copy-spans, near-periodic, random, real text);
- ``PlannedRound``, ``RoundPlan``, ``round_plans(*, k, ...)``, ``planned_round(*, k)`` and
  ``ScriptedDrafter``: drafts that are right for exactly a planned number of tokens;
- ``EngineSettings``, ``engine_settings(...)``, ``DecodingCase``, ``decoding_cases(target_factory, ...)``:
  whole generations with their expected (plain greedy) output;
- ``SessionMachine.configure(...)`` / ``run_session_machine(...)`` / ``replay_session(...)``: requests
  on one live engine (new prompt, regenerate, edits, user turns, earlier prefixes) against plain
  greedy; a failing request raises ``SessionFailure``; ``SessionHistory`` is the
  record (``specproof.formats.session``) a failure saves and replays;
- ``FeatureRows`` / ``FeatureJudge`` / ``feature_layers_of``: the feature oracle (a fresh copy of
  the model fed the accepted context by plain ``forward_with_features``) and the judge of what an
  engine hands a feature drafter, with the cause of a wrong row; the session machine installs
  feature drafters and judges them across requests, and ``engine.features`` uses the same judge;
- ``relation_of`` / ``RelationTracker`` / ``REQUEST_COVERAGE`` (``REQUEST_RELATIONS``, ``RESET_RELATIONS``,
  ``K_RELATIONS``, ``SHARED_BLOCK``): the coverage model of requests (how a
  request relates to the one before it: fresh, the same prompt again, extended, continued, edited early or
  late, shortened, a shared block, unrelated; after reset() or not; k larger, equal or smaller);
- ``BatchSchedule`` / ``batch_schedules(...)``: requests for a batched engine (arrivals, shared
  prefixes, per-row draft plans, EOS mid-block, seeds) and the preemptions and cancellations
  between its steps (docs/contract.md, "Batches");
- ``processor_configs`` / ``stop_sets`` / ``draft_schedules`` (``DECODE_KINDS``): a request's logits processors,
  stops placed on a known continuation at every offset of a draft block, and per-round draft plans
  (docs/contract.md, "Decode state"); ``stop_string_sets`` (``STOP_STRING_SHAPES``): byte-level stop strings
  longer than a block or beginning in the prompt;
- ``TreePlan`` / ``tree_plans(...)`` / ``tree_parents(...)`` / ``ScriptedTreeDrafter``: token trees for tree
  engines (docs/contract.md, "Trees"), scripted from the oracle's continuation, shrinking to one node;
- ``no_local_constants()``: a context in which Hypothesis draws none of the constants of the modules the
  process imported, so a derandomized search draws the same examples in every process (docs/contract.md,
  "Example database");
- ``BatchMachine.configure(...)`` / ``BatchMachineFailure``: a ``RuleBasedStateMachine`` over a batched
  engine's scheduler (add, step, step(only=), abort, preempt) judged against plain greedy solo runs;
- ``RollbackMachine.configure(...)`` / ``run_rollback_machine(...)``: a
  ``RuleBasedStateMachine`` that steps an engine round by round through every
  accept/reject/rollback path and checks the decode convention after each step.

This module is the public facade; the implementation lives in private modules.
"""

from specproof.strategies._batch_machine import BatchMachine, BatchMachineFailure
from specproof.strategies._batch_schedules import BatchSchedule, ScheduledRequest, ScheduleEvent, batch_schedules
from specproof.strategies._contexts import CONTEXT_KINDS, contexts, text_tokens
from specproof.strategies._decode_params import DECODE_KINDS, draft_schedules, processor_configs, stop_sets
from specproof.strategies._feature_judge import FeatureJudge, FeatureRows, feature_layers_of
from specproof.strategies._local_constants import no_local_constants
from specproof.strategies._machine import (
    RollbackMachine,
    RollbackMachineFailure,
    default_decoder_factory,
    release_machine,
    run_rollback_machine,
)
from specproof.strategies._request_relations import COVERAGE as REQUEST_COVERAGE
from specproof.strategies._request_relations import DESCRIPTIONS as RELATION_DESCRIPTIONS
from specproof.strategies._request_relations import K_TAGS as K_RELATIONS
from specproof.strategies._request_relations import RELATIONS as REQUEST_RELATIONS
from specproof.strategies._request_relations import RESET_TAGS as RESET_RELATIONS
from specproof.strategies._request_relations import SHARED_BLOCK, RelationTracker, relation_of
from specproof.strategies._request_relations import unreached as unreached_relations
from specproof.strategies._rounds import (
    ROUND_KINDS,
    PlannedRound,
    RoundPlan,
    ScriptedDrafter,
    ScriptMismatchError,
    planned_round,
    round_plans,
)
from specproof.strategies._session_history import SESSION_FORMAT, SessionFileError, SessionHistory, SessionRequest
from specproof.strategies._session_machine import REUSE_UNREPORTED, SessionMachine, run_session_machine
from specproof.strategies._session_requests import DECODE_REFUSED, DECODE_TAG
from specproof.strategies._session_runner import (
    SessionFailure,
    engine_greedy,
    replay_session,
    shrink_history,
    target_greedy,
)
from specproof.strategies._settings import (
    PROMPT_PLACEMENTS,
    DecodingCase,
    EngineSettings,
    decoding_cases,
    engine_settings,
)
from specproof.strategies._stop_strings import STOP_STRING_SHAPES, stop_string_sets
from specproof.strategies._trees import ScriptedTreeDrafter, TreePlan, tree_parents, tree_plans

__all__ = [
    "DECODE_KINDS",
    "K_RELATIONS",
    "RELATION_DESCRIPTIONS",
    "RESET_RELATIONS",
    "SHARED_BLOCK",
    "STOP_STRING_SHAPES",
    "REQUEST_COVERAGE",
    "REQUEST_RELATIONS",
    "RelationTracker",
    "relation_of",
    "unreached_relations",
    "BatchMachine",
    "BatchMachineFailure",
    "BatchSchedule",
    "ScriptedTreeDrafter",
    "TreePlan",
    "tree_parents",
    "tree_plans",
    "ScheduleEvent",
    "ScheduledRequest",
    "batch_schedules",
    "REUSE_UNREPORTED",
    "DECODE_REFUSED",
    "DECODE_TAG",
    "CONTEXT_KINDS",
    "PROMPT_PLACEMENTS",
    "ROUND_KINDS",
    "DecodingCase",
    "EngineSettings",
    "FeatureJudge",
    "FeatureRows",
    "PlannedRound",
    "RollbackMachine",
    "RollbackMachineFailure",
    "RoundPlan",
    "SESSION_FORMAT",
    "SessionFailure",
    "SessionFileError",
    "SessionHistory",
    "SessionMachine",
    "SessionRequest",
    "ScriptMismatchError",
    "ScriptedDrafter",
    "contexts",
    "draft_schedules",
    "processor_configs",
    "stop_sets",
    "stop_string_sets",
    "decoding_cases",
    "engine_greedy",
    "default_decoder_factory",
    "engine_settings",
    "feature_layers_of",
    "no_local_constants",
    "planned_round",
    "release_machine",
    "replay_session",
    "round_plans",
    "run_rollback_machine",
    "run_session_machine",
    "shrink_history",
    "target_greedy",
    "text_tokens",
]
