"""The ``batch-schedules`` driver: each batch invariant's Hypothesis search over batch schedules.

It applies to every engine case that batches (docs/contract.md, "Batches"): the built-in stack on
the reference hybrid (``BatchSpecDecoder`` over a ``ReferenceSlotPool``, with the case's rollback)
and a plug-in engine that declares ``batch_capabilities``; any other case is skipped, saying why.
Each example draws a ``BatchSchedule`` (``specproof.strategies.batch_schedules``), which shrinks to
the fewest requests and rounds that still fail. With ``--decode-state``, a schedule's requests carry
their own decode parameters where the engine's batch path declares them (``batch_decode_features``:
the built-in batched decoder all of them; a request's output is then judged against plain decoding
with its parameters).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs
import hypothesis
from hypothesis import strategies as st

from specproof.conformance._engine_runs import case_greedy
from specproof.conformance._pit import PitTest
from specproof.conformance._records import Capabilities
from specproof.conformance._sequential import FALSE_FAIL_BOUND
from specproof.conformance.checks.batch import BatchSubject
from specproof.conformance.checks.batch_distribution import SampledTally
from specproof.conformance.checks.batch_seeds import schedule_alpha
from specproof.conformance.checks.decode_grammar import grammars, usable
from specproof.conformance.drivers._protocol import CheckItem, Driver, NotApplicable, require
from specproof.contract import DECODE_FEATURES, BatchCapabilities, ViolationError
from specproof.engine import BatchSpecDecoder, NgramDrafter, ReferenceHybrid, ReferenceSlotPool
from specproof.strategies import batch_schedules

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._results import CheckResult
    from specproof.conformance._subjects import EngineCase

__all__ = ["BUILTIN_SLOTS", "BatchDriver"]

BUILTIN_SLOTS = 3  # the built-in stack's pool: fewer slots than a schedule's requests, so some wait
MAX_REQUESTS = 4
MAX_NEW_TOKENS = 10  # short: a schedule's worth is in its interleavings, not in long generations


class BatchDriver(Driver):
    """Batch schedules on each engine case that batches."""

    name = "batch-schedules"
    options = ("batches",)

    def run(self, item: CheckItem, result: CheckResult) -> None:
        inv, case = item.invariant, item.engine
        assert case is not None
        subject = self._subject(case)
        require(inv, _capabilities(subject))
        strategy = batch_schedules(
            vocab_size=subject.vocab_size,
            k=subject.k,
            max_requests=MAX_REQUESTS,
            max_new_tokens=MAX_NEW_TOKENS,
            max_prompt=min(self.plan.profile.max_prompt, 12),
            preemption=subject.capabilities.preemption,
            seeds=subject.capabilities.batch_invariant_seeding,
            # the decode check always draws decode parameters; every other batch check with --decode-state
            decode_features=subject.decode_features
            if self.plan.decode_state or "batch_decode" in inv.needs or "batch_grammar" in inv.needs
            else frozenset(),
            grammars=grammars() if "batch_grammar" in inv.needs else (),  # batch.grammar's requests only
        )
        notes: list[str] = []
        # batch.sampled-distribution: one PIT test for the run, its values accumulated across the schedules
        tally = SampledTally(PitTest(name=inv.id, alpha=FALSE_FAIL_BOUND))
        subject = attrs.evolve(subject, tally=tally)

        @hypothesis.given(data=st.data())
        def search(data: st.DataObject) -> None:
            result.examples += 1
            # batch.seeds: the n-th schedule's share of the run's false-fail bound (they sum to it)
            judged = attrs.evolve(subject, seed_alpha=schedule_alpha(result.examples, FALSE_FAIL_BOUND))
            outcome = inv.check(judged, data.draw(strategy, label="schedule"))
            result.exercised += outcome.exercised
            if outcome.note and not outcome.exercised:
                notes.append(outcome.note)
            if outcome.violations:
                raise ViolationError(outcome.violations)

        self.context.replay.settings(search, max_examples=self.plan.profile.max_examples, item=item)()
        if tally.generations:
            result.notes.append(f"{tally.describe()} (false-fail bound {FALSE_FAIL_BOUND:g} for the run)")
        if not result.exercised:
            result.skip(notes[-1] if notes else "no schedule reached this check")

    def _subject(self, case: EngineCase) -> BatchSubject:
        """The case as a batch subject (``NotApplicable`` saying why when it does not batch)."""
        plan, cache = self.plan, self.context.cache
        horizon = plan.profile.max_new_tokens

        def greedy(prompt: Sequence[int], n: int, eos: int | None) -> list[int]:
            tokens, _ = case_greedy(case, plan.suite.target, list(prompt), n, eos, horizon=horizon, cache=cache)
            return list(tokens)[:n]

        if case.kind == "builtin":
            target = plan.suite.target
            model = target.make() if target is not None else None
            if not isinstance(model, ReferenceHybrid):
                raise NotApplicable(
                    "the built-in batched decoder runs on the reference hybrid only (a ReferenceSlotPool)"
                )
            k = case.k or 4
            rollback: Literal["checkpoint", "replay"] = "checkpoint" if case.rollback == "checkpoint" else "replay"

            def make_engine() -> Any:
                pool = ReferenceSlotPool(model, slots=BUILTIN_SLOTS)
                return BatchSpecDecoder(pool, NgramDrafter(), k=k, rollback=rollback)

            caps = make_engine().batch_capabilities
            make_reference: Any = target.make if target is not None else None
            batch_decode: object = BatchSpecDecoder.batch_decode_features
        else:
            caps = getattr(case.engine, "batch_capabilities", None)
            if not isinstance(caps, BatchCapabilities) or case.make_engine is None:
                raise NotApplicable(
                    "the engine declares no batch_capabilities: it does not batch (docs/contract.md, Batches)"
                )
            make_engine, k, make_reference = case.make_engine, case.k or 4, case.make_reference
            # what its batch requests honour (a solo call's decode_features may not reach its batch path)
            batch_decode = getattr(case.engine, "batch_decode_features", ())
        decode = _decode_features(batch_decode) if make_reference is not None else frozenset()
        return BatchSubject(
            make_engine=make_engine,
            greedy=greedy,
            vocab_size=case.vocab_size,
            k=k,
            capabilities=caps,
            make_reference=make_reference,
            tie_tolerance=case.tie_tolerance,
            atol=case.atol,
            sampling=plan.sampling,
            decode_features=decode,
        )


def _decode_features(declared: object) -> frozenset[str]:
    """The declared decode features a batch schedule draws (unknown names or a malformed value: none)."""
    if not isinstance(declared, (tuple, list, frozenset, set)):
        return frozenset()
    return frozenset(str(f) for f in declared) & frozenset(DECODE_FEATURES)


def _capabilities(subject: BatchSubject) -> Capabilities:
    caps = subject.capabilities
    white_box = caps.per_slot_state and subject.make_reference is not None
    return Capabilities(
        has={
            "batched",
            *(("per_slot_state",) if white_box else ()),
            *(("batch_decode",) if subject.decode_features else ()),
            *(("batch_sampling",) if caps.sampling else ()),
            *(("batch_grammar",) if "grammar" in subject.decode_features and usable(subject.vocab_size) else ()),
        },
        why_not={
            "per_slot_state": "the engine exposes no per-slot state (`per_slot_state`, `slot_state(id)`) "
            "or there is no model to compare a slot with (`oracle`)",
            "batch_sampling": "the batched engine decodes greedily only (batch_capabilities.sampling is False)",
            "batch_grammar": "the engine's batch requests take no grammar (batch_decode_features) or the vocabulary "
            "cannot write the grammar check's grammars",
            "batch_decode": "the engine's batch requests take no decode parameters (it declares no "
            "batch_decode_features) or there is no model to decode plainly with (`oracle`)",
        },
    )
