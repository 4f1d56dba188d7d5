"""The invariant registry: the one place each check's id, subject, summary, needs and check live.

Everything else is derived from ``REGISTRY``: the per-subject lists, the pytest
parametrization and ids, ``--only``, report rows, what each driver runs and where it
applies, the zoo's expectations, ``check_trace``'s results, the README's invariant table
and ``specproof invariants``. No other module of ``specproof`` spells an id: checks build
their violations with ``inv.violation(...)`` on the ``Invariant`` they are handed.

Checks come in two shapes:

- ``check(inv, case, example) -> Outcome`` (drafter and target invariants, driver
  ``examples``): ``case`` is the resolved subject, ``example`` what ``draw(data, case,
  profile)`` drew in the invariant's own Hypothesis search;
- ``on_record(inv, record) -> Outcome`` (engine invariants, driver ``engine-case``): a
  verdict over one ``RunRecord`` (one generation and what its driver observed). Every
  driver that produces generations (the engine-case search, ``check_trace``, the wire
  client) builds a ``RunRecord`` with its ``Capabilities`` and asks
  ``inv.judge_record(record)``, which first judges ``needs`` against the capabilities.

``Outcome.exercised`` counts what reached the check (calls compared, rounds checked, ...):
zero exercising examples make the check a ``skip``, never a pass.

Adding an engine invariant (see docs/contract.md, "adding an invariant"):

1. a check function ``check_x(inv, ...) -> list[Violation]`` (in ``checks/generation.py``
   for a rule over the records) building its breaches with ``inv.violation(...)``;
2. one ``Invariant(...)`` entry below with ``on_record=_on_record(<adapter>, <exercised>, <held>)``,
   its ``needs`` (names from ``specproof.conformance._records.CAPABILITIES``) and ``zoo``: the
   zoo member(s) it alone or first rejects (``also`` on other entries lists members whose
   bug it catches too);
3. the zoo member itself (``specproof.conformance.zoo``); regenerate the README table
   (``specproof invariants --markdown``). Nothing else names the id.
"""

from __future__ import annotations

import fnmatch
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any, Literal

import attrs
from hypothesis import strategies as st

from specproof.conformance._records import Capabilities, RunRecord
from specproof.conformance._sequential import FALSE_FAIL_BOUND
from specproof.conformance.checks import batch as batch_checks
from specproof.conformance.checks import (
    batch_distribution,
    batch_grammar,
    batch_seeds,
    decode_logprobs,
    decode_parity,
    decode_sampled,
    decode_session,
    target_source,
)
from specproof.conformance.checks import decode_grammar as grammar_checks
from specproof.conformance.checks import decode_grammar_sampled as grammar_sampled
from specproof.conformance.checks import decode_prompt_logprobs as prompt_logprob_checks
from specproof.conformance.checks import decode_state as decode_checks
from specproof.conformance.checks import drafter as drafter_checks
from specproof.conformance.checks import drafts as drafts_checks
from specproof.conformance.checks import features as feature_checks
from specproof.conformance.checks import generation as generation_checks
from specproof.conformance.checks import sampling as sampling_checks
from specproof.conformance.checks import target as target_checks
from specproof.conformance.checks import tree as tree_checks
from specproof.conformance.checks import tree_drafter as tree_drafter_checks
from specproof.conformance.checks import tree_sampling as tree_sampling_checks
from specproof.conformance.checks.generation import round_of_index
from specproof.contract import LOGPROB_TOLERANCE, Generation, Step, UsageError, Violation
from specproof.contract.errors import InvalidSettingError
from specproof.strategies import REQUEST_RELATIONS, contexts

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._engine_runs import EngineRun
    from specproof.conformance._profiles import Profile

__all__ = [
    "REGISTRY",
    "Invariant",
    "Outcome",
    "Subject",
    "by_subject",
    "check_generation",
    "get",
    "markdown_table",
    "registry_json",
    "select",
]

Subject = Literal["drafter", "target", "engine"]
Driver = str  # a driver's name in ``specproof.conformance.drivers.DRIVERS`` (docs/contract.md, "Drivers")


@attrs.frozen
class Outcome:
    """What one check made of one example: the violations found and how much it exercised.

    ``excused`` holds the top-2 margin (or None) of each near-tie divergence a lossless
    check excused (docs/contract.md, "lossless").
    """

    violations: list[Violation] = attrs.Factory(list)
    exercised: int = 1
    note: str = ""  # why nothing was exercised, when exercised == 0; else what held
    excused: tuple[float | None, ...] = ()
    statistics: dict[str, Any] | None = None  # a statistical check's bounds per configuration (the report's)
    # the request relations a drafter walk reached (``REQUEST_COVERAGE`` tags; applicable ones at 0 when missed)
    relations: Mapping[str, int] = attrs.Factory(dict)


Check = Callable[["Invariant", Any, Any], Outcome]
RecordCheck = Callable[["Invariant", RunRecord], Outcome]


@attrs.frozen(kw_only=True)
class Invariant:
    """One registered check.

    ``needs`` names what the subject must expose for the check to apply (capabilities,
    docs/contract.md); ``draws`` says in words how its examples are drawn; ``driver``
    which search runs it (``examples``: its own Hypothesis search over ``draw``;
    ``engine-case``: the one search per engine case; the two state machines).
    ``completes``: the invariant that also says every generation completes (a run
    that raised fails it with the cause; the other engine invariants say they could
    not be checked). ``zoo``: the zoo members this invariant alone (or first) rejects;
    ``also``: zoo members whose bug it catches too.
    """

    id: str
    subject: Subject
    summary: str
    needs: tuple[str, ...] = ()
    draws: str
    driver: Driver = "examples"
    budget: Literal["examples", "capacity"] = "examples"  # capacity: a few examples (filling a target is costly)
    completes: bool = False
    zoo: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    checker: Check | None = attrs.field(default=None, eq=False, repr=False, alias="check")
    on_record: RecordCheck | None = attrs.field(default=None, eq=False, repr=False)
    draw: Callable[[st.DataObject, Any, Profile], Any] | None = attrs.field(default=None, eq=False, repr=False)

    def violation(
        self,
        explanation: str,
        *,
        round: int | None = None,
        expected: object = None,
        actual: object = None,
        example: dict[str, object] | None = None,
    ) -> Violation:
        """A breach of this invariant (the only way a check names an id)."""
        return Violation(
            invariant=self.id,
            explanation=explanation,
            round=round,
            expected=expected,
            actual=actual,
            example=dict(example or {}),
        )

    def applies(self, capabilities: Capabilities) -> str | None:
        """None when the subject exposes what this invariant needs, else why it does not apply."""
        return capabilities.lacks(self.needs)

    def check(self, case: Any, example: Any) -> Outcome:
        """This invariant's verdict on one example of its driver (an ``EngineRun`` for ``engine-case``)."""
        if self.on_record is not None:
            return self._judge_run(example)
        assert self.checker is not None, f"{self.id} is run by its state machine, not judged per example"
        return self.checker(self, case, example)

    judge = check

    def judge_record(self, record: RunRecord) -> Outcome:
        """This engine invariant's verdict on one run record; not applicable: no example exercised."""
        assert self.on_record is not None, f"{self.id} does not judge run records"
        why = self.applies(record.capabilities)
        if why is not None:
            return Outcome([], exercised=0, note=why)
        return self.on_record(self, record)

    def _judge_run(self, run: EngineRun) -> Outcome:
        if run.refused is not None:
            # the hostile-drafter rule: refusing a draft longer than k or out of range is allowed
            return Outcome([], exercised=0, note=f"the engine {run.refused}")
        if run.record is None:
            # A generation that did not complete passes nothing: it fails every check that was asked
            # about it, naming the component that broke it.
            why = str(run.error) if run.invalid else f"the generation did not complete: {run.error}"
            text = why if self.completes else f"{why} (so {self.id} could not be checked)"
            return Outcome([self.violation(text, example=dict(run.example))], exercised=1)
        outcome = self.judge_record(run.record)
        if outcome.violations:
            example = dict(run.example)
            outcome = attrs.evolve(
                outcome, violations=[attrs.evolve(v, example={**example, **v.example}) for v in outcome.violations]
            )
        return outcome

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "subject": self.subject,
            "summary": self.summary,
            "needs": list(self.needs),
            "draws": self.draws,
            "driver": self.driver,
        }


# ---------------------------------------------------------------- drafter invariants


def _draw_drafter_example(data: st.DataObject, case: Any, profile: Profile) -> dict[str, Any]:
    # The unrelated context is drawn first and may be longer than the context under test, so a
    # drafter that keeps a buffer from an earlier generation (and reads past the context it is
    # given, or keys a cache on its length) meets stale data at the lengths it is asked about.
    vocab = case.vocab_size
    other = data.draw(contexts(vocab, min_size=1, max_size=profile.max_prompt * 3), label="unrelated context first")
    ctx = data.draw(contexts(vocab, min_size=1, max_size=profile.max_prompt * 2), label="context")
    ks = data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=6), label="k per call")
    calls = data.draw(st.lists(st.booleans(), min_size=len(ctx), max_size=len(ctx)), label="called at position")
    # a decoder's first call is its whole prompt; its later calls follow its accepted drafts (8: all of them)
    prompt = data.draw(st.integers(1, len(ctx)), label="first prompt length")
    accepts = data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=6), label="draft tokens accepted per round")
    return {"context": ctx, "ks": ks, "other": other, "called": calls, "prompt": prompt, "accepts": accepts}


def _walk_options(case: Any, ex: dict[str, Any]) -> dict[str, Any]:
    """The drawn example's options of a drafter check's relation walk."""
    return {"other": ex["other"], "prompt": ex["prompt"], "accepts": ex["accepts"], "vocab_size": case.vocab_size}


def _calls(reached: Counter[str]) -> int:
    """The calls a relation walk made (each has exactly one relation)."""
    return sum(reached[r] for r in REQUEST_RELATIONS)


def _check_max_length(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    reached: Counter[str] = Counter()
    vs = drafter_checks.check_max_length(
        inv, case.make(), ex["context"], ex["ks"], **_walk_options(case, ex), coverage=reached
    )
    return Outcome(vs, exercised=_calls(reached), relations=reached)


def _check_token_range(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    reached: Counter[str] = Counter()
    vs = drafter_checks.check_token_range(
        inv, case.make(), ex["context"], ex["ks"], **_walk_options(case, ex), coverage=reached
    )
    return Outcome(vs, exercised=_calls(reached), relations=reached)


def _check_deterministic(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    reached: Counter[str] = Counter()
    vs, compared = drafter_checks.check_deterministic(
        inv,
        case.make,
        ex["context"],
        ex["ks"],
        called=ex["called"],
        **_walk_options(case, ex),
        coverage=reached,
    )
    return Outcome(vs, exercised=compared, note="" if compared else "no call could be compared", relations=reached)


def _check_no_mutation(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    reached: Counter[str] = Counter()
    vs, checked = drafter_checks.check_no_mutation(
        inv, case.make(), ex["context"], ex["ks"], **_walk_options(case, ex), coverage=reached
    )
    return Outcome(vs, exercised=checked, note="" if checked else "no call was made", relations=reached)


def _draw_features_example(data: st.DataObject, case: Any, profile: Profile) -> dict[str, Any]:
    vocab = case.vocab_size
    ctx = data.draw(contexts(vocab, min_size=2, max_size=profile.max_prompt * 2), label="context")
    rounds = data.draw(st.integers(1, 6), label="rounds")
    ks = data.draw(st.lists(st.integers(1, 6), min_size=rounds, max_size=rounds), label="k per round")
    accepts = data.draw(st.lists(st.integers(0, 6), min_size=rounds, max_size=rounds), label="draft tokens accepted")
    bonus = data.draw(st.lists(st.integers(0, vocab - 1), min_size=rounds, max_size=rounds), label="bonus tokens")
    edit_at = data.draw(st.one_of(st.none(), st.integers(1, max(1, rounds - 1))), label="edited request at round")
    return {"context": ctx, "ks": ks, "accepts": accepts, "bonus": bonus, "edit_at": edit_at}


def _check_features(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    vs, compared, note = feature_checks.check_drafter_features(
        inv, case.make, ex["context"], ex["ks"], ex["accepts"], ex["bonus"], edit_at=ex["edit_at"]
    )
    return Outcome(vs, exercised=compared, note=note)


# ---------------------------------------------------------------- target invariants


def _draw_target_example(data: st.DataObject, case: Any, profile: Profile) -> dict[str, Any]:
    vocab = case.vocab_size
    prefix_max = min(profile.max_prompt, max(0, case.max_context - 16))
    return {
        "prefix": data.draw(contexts(vocab, min_size=0, max_size=prefix_max), label="prefix"),
        "tokens": data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=9), label="tokens"),
        "data": data,
    }


def _target_check(fn: Callable[..., list[Violation]]) -> Check:
    def check(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
        return Outcome(fn(inv, case.make, ex["prefix"], ex["tokens"]))

    return check


def _check_chunks(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    chunks = ex["data"].draw(st.lists(st.integers(1, 4), min_size=1, max_size=6), label="chunks")
    return Outcome(
        target_checks.check_chunk_invariance(inv, case.make, ex["prefix"], ex["tokens"], chunks, tolerance=case.atol)
    )


def _check_causality(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    data, tokens = ex["data"], ex["tokens"]
    split = data.draw(st.integers(1, len(tokens)), label="split")
    repl = data.draw(
        st.lists(st.integers(0, case.vocab_size - 1), min_size=len(tokens), max_size=len(tokens)), label="replacement"
    )
    return Outcome(
        target_checks.check_causality(inv, case.make, ex["prefix"], tokens, split, repl, tolerance=case.atol)
    )


def _check_restore_like(fn: Callable[..., list[Violation]]) -> Check:
    def check(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
        probe = ex["data"].draw(st.lists(st.integers(0, case.vocab_size - 1), min_size=1, max_size=3), label="probe")
        return Outcome(fn(inv, case.make, ex["prefix"], ex["tokens"], probe, tolerance=case.atol))

    return check


def _check_source(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    chunks = ex["data"].draw(st.lists(st.integers(1, 4), min_size=1, max_size=6), label="chunks")
    src = case.source
    violations, rows, note = target_source.check_matches_source(
        inv,
        case.make,
        src.make,
        ex["prefix"],
        ex["tokens"],
        chunks,
        atol=case.atol,
        rtol=src.rtol,
        router_margin=src.router_margin,
    )
    return Outcome(violations, exercised=rows, note=note)


def _check_capacity(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    overflow = ex["data"].draw(st.integers(2, 5), label="overflow tokens")
    fill = ex["prefix"] or ex["tokens"]
    return Outcome(target_checks.check_capacity(inv, case.make, fill, overflow, ex["tokens"][0]))


# ---------------------------------------------------------------- engine invariants


def _steps(record: RunRecord) -> Sequence[Step]:
    steps = record.generation.steps
    assert steps is not None  # the invariants reading steps need "steps": judged before the check runs
    return steps


def _rounds(record: RunRecord) -> int:
    gen = record.generation
    if gen.steps is not None:
        return len(gen.steps)
    return gen.stats.rounds if gen.stats is not None else 0


def _on_record(
    fn: Callable[[Invariant, RunRecord], list[Violation]],
    exercised: Callable[[RunRecord], int],
    held: Callable[[RunRecord], str],
) -> Callable[[Invariant, RunRecord], Outcome]:
    """An engine invariant's check over one run record: its violations, what of the run reached it
    and, when it held, what held (one line, for ``check_trace``'s table)."""

    def check(inv: Invariant, record: RunRecord) -> Outcome:
        return _counted(fn(inv, record), exercised(record), lambda: held(record))

    return check


def _counted(vs: list[Violation], n: int, held: Callable[[], str], *, unreached: str = "nothing reached it") -> Outcome:
    """The outcome of a check that reached ``n`` things (rounds, comparisons) and found ``vs``.

    A violation is never reported as nothing exercised (``max(n, 1)``); the note says why
    nothing was exercised (``unreached``) or, when the check held, what held (``held()``,
    called only then: some read fields that exist only on a run that reached the check).
    """
    note = unreached if not n else "" if vs else held()
    return Outcome(vs, exercised=n if not vs else max(n, 1), note=note)


def _stop_held(r: RunRecord) -> str:
    unchecked = "" if r.max_context is not None else " (max_context not recorded: context not checked)"
    return f"{len(r.generation.tokens)} tokens, stop: {r.generation.stop_reason}{unchecked}"


def _lossless(inv: Invariant, record: RunRecord) -> Outcome:
    verdict = record.lossless
    assert verdict is not None  # needs "oracle"
    breach = verdict.breach()
    if breach is None:
        margin = verdict.margin if verdict.status == "excused" else None
        excused = (margin,) if verdict.status == "excused" else ()
        return Outcome([], exercised=1, note=verdict.explanation, excused=excused)
    steps = record.generation.steps
    rnd = round_of_index(steps, verdict.index) if steps and verdict.index is not None else None
    return Outcome([inv.violation(round=rnd, **breach)], exercised=1)  # type: ignore[arg-type]


def _state_restored(inv: Invariant, record: RunRecord) -> Outcome:
    if record.state is None:
        return Outcome([], exercised=0, note="no state comparison could be made")
    n = record.state_checks
    return _counted([inv.violation(**found) for found in record.state], n, lambda: f"{n} state comparisons")


def _features(inv: Invariant, record: RunRecord) -> Outcome:
    if record.features is None:
        return Outcome([], exercised=0, note="no feature drafter was installed")
    n = record.feature_checks
    return _counted(
        [inv.violation(**found) for found in record.features],
        n,
        lambda: f"{n} proposals",
        unreached="the engine never handed its feature drafter features",
    )


def _drafts_used(inv: Invariant, record: RunRecord) -> Outcome:
    if record.proposals is None:
        return Outcome([], exercised=0, note="the engine drafted for itself (it takes no drafts from the suite)")
    vs, compared = drafts_checks.check_drafts_used(
        inv,
        _steps(record),
        record.proposals,
        max_new_tokens=record.max_new_tokens,
        k=record.k,
        max_context=record.max_context,
        vocab_size=record.vocab_size,
    )
    return _counted(vs, compared, lambda: f"{compared} rounds used the draft sent")


def _accept_bounds(inv: Invariant, r: RunRecord) -> list[Violation]:
    return generation_checks.check_accept_bounds(inv, _steps(r), k=r.k)


def _accept_rule(inv: Invariant, r: RunRecord) -> list[Violation]:
    return generation_checks.check_accept_rule(inv, _steps(r))


def _kv_length(inv: Invariant, r: RunRecord) -> list[Violation]:
    return generation_checks.check_kv_length(
        inv, _steps(r), prompt_length=len(r.prompt), final_processed=r.final_processed, tokens=r.generation.tokens
    )


def _stop(inv: Invariant, r: RunRecord) -> list[Violation]:
    gen = r.generation
    return generation_checks.check_stop(
        inv,
        gen.tokens,
        gen.stop_reason,
        max_new_tokens=r.max_new_tokens,
        eos_token_id=r.eos,
        prompt_length=len(r.prompt),
        max_context=r.max_context,
        final_processed=r.final_processed,
    )


def _cost(inv: Invariant, r: RunRecord) -> list[Violation]:
    return generation_checks.check_cost(inv, r.generation, rollback=r.rollback, prompt_length=len(r.prompt))


def _consistency(inv: Invariant, r: RunRecord) -> list[Violation]:
    gen = r.generation
    return generation_checks.check_trace_consistency(
        inv, gen.tokens, _steps(r), gen.stop_reason, max_new_tokens=r.max_new_tokens, eos_token_id=r.eos
    )


_DRAFTER_DRAWS = (
    "an unrelated context (drawn first, up to 3x the prompt length), then a context and the k of each call; "
    "the drafter is called on growing prefixes as a decoder calls it, and every call of a relation walk is "
    "judged (every relation of a request to the one before: the same prompt at a larger, equal and smaller k, "
    "extended by its draft, decoder rounds, a shared block after a different prefix, late and early edits, a "
    "shorter prefix, an unrelated prompt, a regenerate and a user turn after reset())"
)
_TARGET_DRAWS = "a prefix (adversarial contexts) and 1-9 tokens fed after it"
_ENGINE_DRAWS = (
    "one search per engine case: k, max_new_tokens, a prompt (sometimes ending near max_context), EOS drawn "
    "among the greedy continuation (often among its last k+1 tokens), and the suite's scripted drafter "
    "(round plans reaching every path) or the subject's own"
)


# ---------------------------------------------------------------- sampling invariants

_SAMPLING_DRAWS = (
    "with --sampling: seeded generations (seeds 0, 1, ...) on four fixed prompts, the suite's deterministic "
    "drafts read off the oracle (most drawn from p, so full blocks are common; or the engine's own), every "
    "other one after the first pass given an EOS id kept inside a drafted block, until the event tests reach "
    "the profile's sensitivity; a few seeds again on every configuration; two prompts at temperature 0 and "
    "at top_k 1"
)
_SAMPLING_DRAFTER_DRAWS = (
    "with --sampling: propose_sampled on fixed contexts with seeded generators, until the event tests reach "
    "the profile's sensitivity"
)


def _sampling_check(
    judge: Callable[[Invariant, Any], tuple[list[Violation], int, list[str]]], *, shortfall: bool = False
) -> Check:
    """An engine sampling invariant's check: ``judge(inv, judged)`` over the case's sampled search
    (``drivers._sampling``); with ``shortfall`` (the statistical distribution check), a run that could not
    reach the profile's sensitivity is a skip that says so, never a pass, and the result carries the
    bounds and sample sizes of each configuration (the report's ``statistics``)."""

    def check(inv: Invariant, driver: Any, judged: Any) -> Outcome:
        violations, exercised, notes = judge(inv, judged)
        tv = judged.plan.profile.sampling_tv
        statistics = sampling_checks.distribution_statistics(judged.search, tv_target=tv) if shortfall else None
        if shortfall and not violations:
            why = sampling_checks.sensitivity_shortfall(judged.search, tv_target=tv)
            if why is not None:
                return Outcome([], exercised=0, note="\n".join([why, *notes]), statistics=statistics)
        return Outcome(violations, exercised=exercised, note="\n".join(notes), statistics=statistics)

    return check


def _drafter_sampling_check(inv: Invariant, driver: Any, subject: Any) -> Outcome:
    plan = driver.plan
    vocab = plan.suite.target.vocab_size if plan.suite.target is not None else 256
    violations, exercised, notes = sampling_checks.check_proposal_distribution(
        inv,
        subject.make,
        params=plan.sampling,
        vocab_size=vocab,
        seed=plan.seed or 0,
        longest=plan.profile.max_prompt,
        # proposals cost no target forward: the drafter is held to a quarter of the engine's deviation
        tv_target=plan.profile.sampling_tv / 4,
        budget=plan.profile.sampling_proposals,
        alpha=FALSE_FAIL_BOUND,
    )
    return Outcome(violations, exercised=exercised, note="\n".join(notes))


_DECODE_DRAWS = (
    "with an engine that declares decode_features: a prompt, 4-20 new tokens, the processors it declares "
    "(repetition / presence / frequency penalties, a logit bias, bad words), then for min_tokens an EOS id taken "
    "from plain decoding's continuation with min_tokens around its first place, or for stops 1-3 stop sequences "
    "and EOS ids ending at drawn places of that continuation; the suite's drafts follow the continuation (on past "
    "the stop) with a drawn schedule of full, empty, rejected-at-0 and partial rounds"
)


def _decode_check(fn: Callable[..., tuple[list[Violation], int, str]]) -> Check:
    def check(inv: Invariant, subject: Any, example: Any) -> Outcome:
        violations, exercised, note = fn(inv, decode_checks.run_decode_example(subject, example))
        return Outcome(violations, exercised=exercised, note=note)

    return check


def _decode_draw(kind: str) -> Callable[[st.DataObject, Any, Profile], Any]:
    def draw(data: st.DataObject, subject: Any, profile: Profile) -> Any:
        return decode_checks.draw_decode_example(data, subject, kind)

    return draw


_DECODE_REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="decode.penalties",
        subject="engine",
        summary="with penalties, a logit bias and bad words, the output equals plain decoding's with the same "
        "processors (each draft row processed with the state advanced through the draft before it)",
        needs=("decode_state", "decode_processors"),
        draws=_DECODE_DRAWS,
        driver="decode-state",
        check=_decode_check(decode_checks.check_decode_output),
        draw=_decode_draw("penalties"),
        zoo=("penalty_from_last_token", "penalties_ignored_when_drafting", "logit_bias_ignored_when_drafting"),
        also=("penalty_buffer_keeps_rejected",),
    ),
    Invariant(
        id="decode.min-tokens",
        subject="engine",
        summary="with min_tokens, every EOS id is masked until exactly that many tokens are out, on every draft "
        "row as in plain decoding",
        needs=("decode_state", "decode_min_tokens"),
        draws=_DECODE_DRAWS,
        driver="decode-state",
        check=_decode_check(decode_checks.check_decode_output),
        draw=_decode_draw("min_tokens"),
        zoo=("min_tokens_extra_row",),
        also=(
            "penalty_from_last_token",
            "penalties_ignored_when_drafting",
            "logit_bias_ignored_when_drafting",
            "penalty_buffer_keeps_rejected",
        ),
    ),
    Invariant(
        id="decode.stop",
        subject="engine",
        summary="with several EOS ids and stop sequences, the output is cut where plain decoding stops (inside an "
        "accepted block, across two rounds, on an EOS), with the same stop reason",
        needs=("decode_state", "decode_stops"),
        draws=_DECODE_DRAWS,
        driver="decode-state",
        check=_decode_check(decode_checks.check_decode_output),
        draw=_decode_draw("stops"),
        zoo=("stop_missed_inside_block",),
        also=("logit_bias_ignored_when_drafting", "penalty_buffer_keeps_rejected"),
    ),
    Invariant(
        id="decode.processor-state",
        subject="engine",
        summary="after every round the engine's processor state equals a fresh processor's fed only the committed "
        "tokens: no rejected draft token in it, none missing",
        needs=("decode_state", "decode_processors", "processor_state"),
        draws=_DECODE_DRAWS,
        driver="decode-state",
        check=_decode_check(decode_checks.check_processor_states),
        draw=_decode_draw("penalties"),
        zoo=("penalty_buffer_keeps_rejected",),
        also=("penalty_from_last_token",),
    ),
)


_GRAMMAR_DRAWS = (
    "with an engine that declares grammar in decode_features: a prompt, 8-20 new tokens, one of the check's "
    "grammars (two JSON schemas, a regex, a Lark CFG) with an EOS id that stands for no text, maybe the "
    "processors it declares, and maybe a reasoning delimiter of 1-3 tokens ending at a drawn place of plain "
    "decoding's free continuation; the suite's drafts follow the constrained output and run on past it with the "
    "free continuation, on a drawn schedule of full, empty, rejected-at-0 and partial rounds"
)


def _grammar_check(inv: Invariant, subject: Any, example: Any) -> Outcome:
    violations, exercised, note = grammar_checks.check_grammar(
        inv, grammar_checks.run_grammar_example(subject, example)
    )
    return Outcome(violations, exercised=exercised, note=note)


_GRAMMAR_REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="decode.grammar",
        subject="engine",
        summary="with a grammar (JSON schema, regex, CFG, or free text until a reasoning delimiter), every emitted "
        "prefix is valid, the output equals plain decoding's with the grammar, and the matcher after each round is a "
        "fresh matcher fed the committed tokens",
        needs=("decode_state", "decode_grammar"),
        draws=_GRAMMAR_DRAWS,
        driver="decode-state",
        check=_grammar_check,
        draw=lambda data, subject, profile: grammar_checks.draw_grammar_example(data, subject),
        zoo=(
            "grammar_mask_first_row_only",
            "grammar_not_rolled_back",
            "grammar_one_behind_after_block",
            "grammar_off_when_delimiter_in_block",
            "grammar_terminated_advanced",
        ),
    ),
)


def _check_grammar_sampled(inv: Invariant, subject: Any, example: Any) -> Outcome:
    violations, exercised, note = grammar_sampled.check_grammar_sampled(inv, subject, example)
    return Outcome(violations, exercised=exercised, note=note)


def _draw_grammar_sampled(data: st.DataObject, subject: Any, profile: Profile) -> Any:
    # as decode.sampled: each example's PIT test at FALSE_FAIL_BOUND / max_examples, so the run's is FALSE_FAIL_BOUND
    return grammar_sampled.draw_grammar_sampled(data, subject, alpha=FALSE_FAIL_BOUND / profile.max_examples)


_GRAMMAR_SAMPLED_REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="decode.grammar-sampled",
        subject="engine",
        summary="sampled with a grammar (JSON schema, regex, CFG, or free text until a reasoning delimiter), every "
        "emitted prefix is valid, the matcher after each round is a fresh matcher fed the committed tokens, and the "
        "emitted tokens follow plain sampling from the grammar-masked processed p (all-token PIT, DKW-Massart; "
        "false-fail bound 1e-6 a run)",
        needs=("decode_state", "decode_grammar", "decode_sampled"),
        draws="a prompt, 8-16 new tokens, one of decode.grammar's grammars, half the time after a reasoning delimiter "
        "of 1-2 tokens early in plain decoding's free continuation, maybe the processors the engine declares, one of "
        f"decode.sampled's sampling settings and {grammar_sampled.GENERATIONS} seeded generations; the suite's "
        "drafter drafts, after whatever was sampled so far, the rest of the delimiter and then tokens the grammar "
        "allows",
        driver="decode-state",
        check=_check_grammar_sampled,
        draw=_draw_grammar_sampled,
        zoo=("grammar_unmasked_residual_when_sampling", "grammar_follows_argmax_when_sampling"),
        also=("grammar_not_rolled_back",),
    ),
)


def _check_logprobs(inv: Invariant, subject: Any, example: Any) -> Outcome:
    run = decode_checks.run_decode_example(subject, example)
    violations, exercised, note = decode_logprobs.check_logprobs(inv, run, subject)
    return Outcome(violations, exercised=exercised, note=note)


def _check_stop_strings(inv: Invariant, subject: Any, example: Any) -> Outcome:
    run = decode_checks.run_decode_example(subject, example)
    violations, exercised, note = decode_logprobs.check_stop_strings(inv, run, subject)
    return Outcome(violations, exercised=exercised, note=note)


def _check_prompt_logprobs(inv: Invariant, subject: Any, example: Any) -> Outcome:
    run = decode_checks.run_decode_example(subject, example)
    violations, exercised, note = prompt_logprob_checks.check_prompt_logprobs(inv, run, subject)
    return Outcome(violations, exercised=exercised, note=note)


def _draw_prompt_logprobs(data: st.DataObject, subject: Any, profile: Profile) -> Any:
    return prompt_logprob_checks.draw_prompt_logprobs(data, subject)


def _check_sampled_decode(inv: Invariant, subject: Any, example: Any) -> Outcome:
    violations, exercised, note = decode_sampled.check_sampled_decode(inv, subject, example)
    return Outcome(violations, exercised=exercised, note=note)


def _draw_sampled_decode(data: st.DataObject, subject: Any, profile: Profile) -> Any:
    # the false-fail bound split over the examples: each example's PIT test is at FALSE_FAIL_BOUND / max_examples
    return decode_sampled.draw_sampled_decode(data, subject, alpha=FALSE_FAIL_BOUND / profile.max_examples)


def _check_parity(inv: Invariant, subject: Any, example: Any) -> Outcome:
    violations, exercised, note = decode_parity.check_parameter_parity(inv, subject, example)
    return Outcome(violations, exercised=exercised, note=note)


def _draw_parity(data: st.DataObject, subject: Any, profile: Profile) -> Any:
    return decode_parity.draw_parity_example(data, subject)


_DECODE_OUTPUT_REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="decode.logprobs",
        subject="engine",
        summary="each emitted token's logprob, after the processors, equals the teacher-forced scoring of the "
        f"output within {LOGPROB_TOLERANCE:g} (top-n alternatives too), one per token, cut with the tokens at the "
        "stop: never a placeholder, never the drafter's, never the wrong row's",
        needs=("decode_state", "decode_logprobs"),
        draws=_DECODE_DRAWS + "; for logprobs every declared processor on, stops half the time, 0-3 alternatives",
        driver="decode-state",
        check=_check_logprobs,
        draw=_decode_draw("logprobs"),
        zoo=(
            "logprobs_from_drafter",
            "logprobs_wrong_row",
            "logprobs_before_processors",
            "logprobs_past_stop",
        ),
    ),
    Invariant(
        id="decode.prompt-logprobs",
        subject="engine",
        summary="each prompt token's logprob after the ones before it, where the engine returns them, equals the "
        f"teacher-forced scoring of the prompt within {LOGPROB_TOLERANCE:g} (before any processor; top-n "
        "alternatives too), one per prompt token after the first, and the output is unchanged by asking",
        needs=("decode_state", "decode_prompt_logprobs"),
        draws="with an engine that declares prompt_logprobs: a prompt of 2-16 tokens, 4-8 new tokens, every "
        "processor it declares on, 0-3 alternatives where it declares top_logprobs, a drawn draft schedule",
        driver="decode-state",
        check=_check_prompt_logprobs,
        draw=_draw_prompt_logprobs,
        zoo=("prompt_logprobs_off_by_one",),
    ),
    Invariant(
        id="decode.stop-strings",
        subject="engine",
        summary="with byte-level stop strings (a byte vocabulary), the output, its token ids and its logprobs are "
        "cut where plain decoding stops (inside an accepted block, straddling two rounds, on an EOS), with the "
        "same stop reason",
        needs=("decode_state", "decode_stop_strings"),
        draws=_DECODE_DRAWS + "; for stop strings the placed stop sequences as their tokens' bytes, a string longer "
        "than a draft block (straddling two or three rounds) or one beginning in the prompt's text; logprobs asked "
        "where the engine declares them",
        driver="decode-state",
        check=_check_stop_strings,
        draw=_decode_draw("stop_strings"),
        zoo=("stop_string_missed_across_rounds", "stop_string_window_one_block", "stop_string_in_prompt_text"),
        also=("stop_missed_inside_block",),
    ),
    Invariant(
        id="decode.sampled",
        subject="engine",
        summary="sampled with penalties, a logit bias and bad words, the emitted tokens follow plain sampling from "
        "the processed p (all-token PIT, DKW-Massart; false-fail bound 1e-6 a run)",
        needs=("decode_state", "decode_processors", "decode_sampled"),
        draws="a prompt, 8-16 new tokens, every processor the engine declares on, one of three sampling settings "
        f"(T=1; T=1.5, top-k 12; T=0.8, top-p 0.95) and {decode_sampled.GENERATIONS} seeded generations, the "
        "suite's full drafts following plain greedy decoding with the processors",
        driver="decode-state",
        check=_check_sampled_decode,
        draw=_draw_sampled_decode,
        zoo=("penalties_skipped_when_sampling",),
    ),
    Invariant(
        id="decode.parameter-parity",
        subject="engine",
        summary="a decode parameter that changes plain decoding's output changes the engine's output the same "
        "way, or the engine refuses the request: never silently ignored (also for an engine that declares no "
        "decode_features)",
        needs=("decode_state",),
        draws="a prompt, 8-20 new tokens and one parameter alone (frequency, presence or repetition penalty, a "
        "-100 logit bias on a token of plain decoding's continuation, or min_tokens past an EOS id placed on it), "
        "the suite's drafts following plain decoding with it under a drawn schedule",
        driver="decode-state",
        check=_check_parity,
        draw=_draw_parity,
        zoo=("frequency_penalty_ignored",),
    ),
)


def _check_decode_session(inv: Invariant, subject: Any, example: Any) -> Outcome:
    violations, exercised, note = decode_session.check_decode_session(inv, subject, example)
    return Outcome(violations, exercised=exercised, note=note)


def _draw_decode_session(data: st.DataObject, subject: Any, profile: Profile) -> Any:
    return decode_session.draw_decode_session(data, subject)


# a check of its own, not a session.* one: the session machine's draws (and its saved histories) stay as they
# were without --decode-state, and this one runs only with it
_DECODE_SESSION_REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="decode.session",
        subject="engine",
        summary="the requests of a session on one engine, each with its own decode parameters, each equal plain "
        "decoding with its own parameters: no processor state (penalty buffer, min_tokens count, stop matcher) "
        "carried from one request to the next",
        needs=("decode_state", "decode_processors"),
        draws="a fresh engine per example and 2-4 requests on it, each a new prompt, a user turn of 1-4 tokens on "
        "the last context, the last prompt again, or a new prompt after reset() where the engine has one; each "
        "with every processor the engine declares on (strengths drawn per request), 6-10 new tokens and, half "
        "the time, stop sequences and EOS ids or a min_tokens against an EOS id placed on its own plain continuation; "
        "the suite's drafts follow it under a drawn schedule",
        driver="decode-state",
        check=_check_decode_session,
        draw=_draw_decode_session,
        zoo=("penalty_counts_carried_over", "output_carried_over"),
    ),
)

_BATCH_DRAWS = (
    "batch schedules: 1-4 requests (prompts sharing a prefix with the first's, 1-10 new tokens, an EOS placed in "
    "the continuation, a seed where seeding is batch-invariant), each with its own scripted draft plan (all "
    "accepted, empty, rejected at 0, partial, short, full then empty) and arrival step, and up to two "
    "preemptions (each declared mode) or cancellations right after a request's first round"
)


def _batch_check(fn: Callable[..., tuple[list[Violation], int, str]]) -> Check:
    def check(inv: Invariant, subject: Any, schedule: Any) -> Outcome:
        violations, exercised, note = fn(inv, subject, schedule)
        return Outcome(violations, exercised=exercised, note=note)

    return check


_BATCH_REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="batch.isolation",
        subject="engine",
        summary="each request of a batch equals its solo run (plain greedy; a seeded one: the engine alone), "
        "whatever is in flight with it",
        needs=("batched",),
        draws=_BATCH_DRAWS,
        driver="batch-schedules",
        check=_batch_check(batch_checks.check_isolation),
        zoo=("batch_pads_recurrent_state", "batch_rollback_wrong_slot", "batch_verify_depends_on_batch_size"),
        also=("batch_stale_zero_draft", "batch_slot_not_cleared"),
    ),
    Invariant(
        id="batch.schedule-invariance",
        subject="engine",
        summary="the same outputs with preemptions (snapshot, recompute) and cancellations placed between steps, "
        "with the arrivals reversed, and with the longest request preempted after its first round in each mode",
        needs=("batched",),
        draws=_BATCH_DRAWS,
        driver="batch-schedules",
        check=_batch_check(batch_checks.check_schedule_invariance),
        zoo=("batch_stale_resume",),
        also=("batch_stale_zero_draft", "batch_pads_recurrent_state", "batch_rollback_wrong_slot"),
    ),
    Invariant(
        id="batch.slot-reuse",
        subject="engine",
        summary="requests run one after another on one engine (A, B, ..., A) each equal their solo run: "
        "a freed slot passes nothing on",
        needs=("batched",),
        draws=_BATCH_DRAWS,
        driver="batch-schedules",
        check=_batch_check(batch_checks.check_slot_reuse),
        zoo=("batch_slot_not_cleared",),
    ),
    Invariant(
        id="batch.decode-state",
        subject="engine",
        summary="requests with their own decode parameters (penalties, logit bias, bad words, min_tokens, a stop "
        "sequence) batched together each equal plain decoding with their own: no neighbour's decode state leaks in",
        needs=("batched", "batch_decode"),
        draws=_BATCH_DRAWS + "; each request with or without its own processors, min_tokens and a stop sequence "
        "placed in its continuation under them",
        driver="batch-schedules",
        check=_batch_check(batch_checks.check_decode_isolation),
        zoo=("batch_shared_penalty_buffer",),
    ),
    Invariant(
        id="batch.grammar",
        subject="engine",
        summary="requests with their own grammars (JSON schema, regex, CFG, reasoning delimiter) batched together "
        "each give plain decoding's output with their grammar (sampled: every prefix valid, and its run alone): "
        "one matcher per request, rolled back per request",
        needs=("batched", "batch_grammar"),
        draws=_BATCH_DRAWS + "; each request with or without one of decode.grammar's grammars (its EOS the "
        "grammar's), half the time after a 1-2 token reasoning delimiter placed in its free continuation, and "
        "its own processors; a sampled request drafts what its grammar allows after what it sampled",
        driver="batch-schedules",
        check=_batch_check(batch_grammar.check_batch_grammar),
        zoo=("batch_shared_grammar_matcher", "batch_grammar_rollback_wrong_request"),
    ),
    Invariant(
        id="batch.per-slot-state",
        subject="engine",
        summary="after every step each running request's slot (KV, conv, recurrent state) equals a fresh "
        "model fed its accepted tokens",
        needs=("batched", "per_slot_state"),
        draws=_BATCH_DRAWS,
        driver="batch-schedules",
        check=_batch_check(batch_checks.check_per_slot_state),
        zoo=("batch_stale_zero_draft",),
        also=("batch_pads_recurrent_state", "batch_slot_not_cleared"),
    ),
    Invariant(
        id="batch.liveness",
        subject="engine",
        summary="every verify round commits a token for each request it advances, every step advances one, "
        "and the batch finishes within its bound",
        needs=("batched",),
        draws=_BATCH_DRAWS,
        driver="batch-schedules",
        check=_batch_check(batch_checks.check_liveness),
        zoo=("batch_retries_rejected_row",),
        also=("batch_rollback_wrong_slot",),
    ),
    Invariant(
        id="batch.seeds",
        subject="engine",
        summary="a seeded request emits its solo run's tokens beside neighbours seeded otherwise, unseeded or "
        "greedy (where the engine declares batch_invariant_seeding); two unseeded requests with one prompt in "
        "one batch repeat each other's opening no more often than independent streams (Poisson-binomial tail)",
        needs=("batched", "batch_sampling"),
        draws=_BATCH_DRAWS + "; per schedule, its first request seeded beside neighbours of each seeding and "
        f"{batch_seeds.TRIALS} batches of two unseeded requests with its prompt",
        driver="batch-schedules",
        check=_batch_check(batch_seeds.check_seeds),
        zoo=("batch_one_rng_stream", "batch_seed_ignored_beside_unseeded"),
    ),
    Invariant(
        id="batch.sampled-distribution",
        subject="engine",
        summary="every token of a sampled request in a batch is drawn from p, whatever is batched with it: the "
        "randomized PIT of every emitted token, accumulated over the run's schedules, is uniform (DKW-Massart, "
        "false-fail bound 1e-6 for the run)",
        needs=("batched", "batch_sampling"),
        draws=_BATCH_DRAWS + "; per schedule, a greedy neighbour first that outlasts the others, then the "
        f"schedule's requests sampled (the --sampling parameters), each with a fresh seed and at least "
        f"{batch_distribution.MIN_NEW_TOKENS} new tokens",
        driver="batch-schedules",
        check=_batch_check(batch_distribution.check_sampled_distribution),
        zoo=("batch_temperature_from_first_row",),
    ),
)


def _draw_tree_drafter_example(data: st.DataObject, case: Any, profile: Profile) -> dict[str, Any]:
    ctx = data.draw(contexts(case.vocab_size, min_size=1, max_size=profile.max_prompt * 2), label="context")
    lengths = data.draw(st.lists(st.integers(1, len(ctx)), min_size=1, max_size=6), label="prefix lengths")
    budgets = data.draw(
        st.lists(st.tuples(st.integers(0, 24), st.integers(0, 6)), min_size=len(lengths), max_size=len(lengths)),
        label="max_nodes and max_depth per call",
    )
    calls = [(n, nodes, depth) for n, (nodes, depth) in zip(sorted(lengths), budgets, strict=True)]
    return {"context": ctx, "calls": calls}


def _check_tree_drafter(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    vs, exercised, note = tree_drafter_checks.check_tree_well_formed(
        inv, case.make(), ex["context"], ex["calls"], vocab_size=case.vocab_size
    )
    return Outcome(vs, exercised=exercised, note=note)


def _check_tree_drafter_deterministic(inv: Invariant, case: Any, ex: dict[str, Any]) -> Outcome:
    vs, compared, note = tree_drafter_checks.check_tree_deterministic(inv, case.make, ex["context"], ex["calls"])
    return Outcome(vs, exercised=compared, note=note)


_TREE_DRAWS = (
    "tree cases: a prompt, 1-12 new tokens, an EOS from plain greedy's output (so on non-first branches too), "
    "a tree plan for every round (1-3 siblings a level, 1-4 levels, the winner at any sibling position, decoys "
    "with subtrees or sharing a token, a childless twin of the winner) and an arbitrary probe tree of 1-6 nodes"
)


def _tree_check(fn: Callable[..., tuple[list[Violation], int, str]], *, needs_run: bool = True) -> Check:
    def check(inv: Invariant, subject: Any, case: Any) -> Outcome:
        run = tree_checks.run_tree_case(subject, case) if needs_run else None
        violations, exercised, note = fn(subject, case, run)
        return Outcome(violations, exercised=exercised, note=note)

    return check


def _tree_sampling_check(inv: Invariant, driver: Any, search: Any) -> Outcome:
    """``tree.sampled-distribution`` over the case's sampled tree search; a pass that could not reach the
    profile's sensitivity (``sampling_tv``) is a skip that says so."""
    violations, exercised, notes = tree_sampling_checks.check_sampled_distribution(search)
    tv = driver.plan.profile.sampling_tv
    statistics = tree_sampling_checks.sampled_tree_statistics(search, tv_target=tv)
    if not violations and exercised:
        why = tree_sampling_checks.sensitivity_shortfall(search, tv_target=tv)
        if why is not None:
            return Outcome([], exercised=0, note="\n".join([why, *notes]), statistics=statistics)
    return Outcome(violations, exercised=exercised, note="\n".join(notes), statistics=statistics)


_TREE_REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="tree.per-node-state",
        subject="engine",
        summary="white-box: each node of a verified tree has the logits row and the state (KV, conv, recurrent) "
        "of sequential decoding of its root path",
        needs=("tree", "tree_state"),
        draws=_TREE_DRAWS,
        driver="tree-cases",
        check=_tree_check(tree_checks.check_per_node_state, needs_run=False),
        zoo=("tree_verified_as_chain", "tree_sibling_state_leak", "tree_conv_from_previous_node"),
        also=("tree_stale_sibling_kv",),
    ),
    Invariant(
        id="tree.committed-state",
        subject="engine",
        summary="after every tree round the state is the accepted path's (a fresh model fed the context), also "
        "when the winner is not the first sibling and when every branch is rejected at the root",
        needs=("tree",),
        draws=_TREE_DRAWS,
        driver="tree-cases",
        check=_tree_check(tree_checks.check_committed_state),
        zoo=("tree_accepted_index_as_chain", "tree_commits_first_sibling", "tree_stale_sibling_kv"),
        also=("tree_sibling_state_leak", "tree_conv_from_previous_node"),
    ),
    Invariant(
        id="tree.greedy-lossless",
        subject="engine",
        summary="greedy output with a tree equals the output with a chain and with no speculation",
        needs=("tree",),
        draws=_TREE_DRAWS,
        driver="tree-cases",
        check=_tree_check(tree_checks.check_greedy_lossless),
        zoo=("tree_bonus_from_wrong_row",),
        also=(
            "tree_commits_first_sibling",
            "tree_accepted_index_as_chain",
            "tree_sibling_state_leak",
            "tree_stale_sibling_kv",
        ),
    ),
    Invariant(
        id="tree.round-bounds",
        subject="engine",
        summary="a tree round emits 1 to depth + 1 tokens, and the accepted tokens are one root path plus a bonus",
        needs=("tree",),
        draws=_TREE_DRAWS,
        driver="tree-cases",
        check=_tree_check(tree_checks.check_round_bounds),
        zoo=("tree_reports_chain_indices",),
    ),
    Invariant(
        id="tree.well-formed",
        subject="engine",
        summary="every tree verified has parents before children and fits its round's limits (nodes; depth "
        "within the tokens still wanted less the bonus)",
        needs=("tree",),
        draws=_TREE_DRAWS,
        driver="tree-cases",
        check=_tree_check(tree_checks.check_well_formed),
        zoo=("tree_ignores_depth_budget",),
    ),
    Invariant(
        id="tree.sampled-distribution",
        subject="engine",
        summary="sampled output with trees has plain sampling's distribution: with the suite's trees, two sibling "
        "events at each tree node the emitted path reaches; with a real drafter's sampled trees, two events on "
        "p's top tokens; an all-token PIT test each (false-fail bound 1e-6 per engine case)",
        needs=("tree",),
        draws="with --trees and --sampling: 4x the profile's sampled generations on four fixed prompts, seeds "
        "0, 1, ... (or from --seed), each round's tree the suite's: deterministic, read off the oracle (2-3 "
        "siblings of mixed rank, a duplicate sibling, a subtree under a first or a later sibling, up to 3 levels); "
        "then as many with a real drafter's sampled 2x2x2 trees (declared q rows)",
        driver="tree-sampling",
        check=_tree_sampling_check,
        zoo=("tree_sampled_two_siblings", "tree_sampled_stale_residual"),
    ),
)


REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="drafter.max-length",
        subject="drafter",
        summary="`len(draft) <= k`; `k == 0` gives `[]`",
        draws=_DRAFTER_DRAWS,
        check=_check_max_length,
        draw=_draw_drafter_example,
        zoo=("too_long", "depth_grows_over_requests", "draft_cache_ignores_k"),
        also=("returns_generator",),
    ),
    Invariant(
        id="drafter.token-range",
        subject="drafter",
        summary="the draft is a sequence (list, tuple, 1-D array) of ints in `[0, vocab_size)`",
        draws=_DRAFTER_DRAWS,
        check=_check_token_range,
        draw=_draw_drafter_example,
        zoo=("out_of_range", "returns_generator"),
    ),
    Invariant(
        id="drafter.deterministic",
        subject="drafter",
        summary="the draft depends only on the context passed in and k: not on earlier calls, "
        "nor (after `reset()`) on earlier generations",
        draws=_DRAFTER_DRAWS + "; a first prompt length and the draft tokens accepted per round: one drafter driven "
        "as a decoder builds the context, others are called at every position, at only some, and after reset() "
        "from a whole prompt longer and shorter than the context they held, every call against a fresh drafter; "
        "a declared history_dependent drafter is driven through a session (new prompt, edit, shorter prefix, "
        "user turn), replayed and after reset()",
        check=_check_deterministic,
        draw=_draw_drafter_example,
        zoo=(
            "nondeterministic",
            "sticky_cache",
            "match_pointer",
            "reads_past_context",
            "model_drafter_no_rollback",
            "model_drafter_kv_only_rollback",
            "model_drafter_kv_only_rollback_gdn",
            "model_drafter_reset_keeps_state",
            "prompt_only_lookup",
            "head_keeps_chain_after_full_accept",
            "head_lazy_reset_keeps_longer",
            "raises_on_shorter_request",
            "reset_keeps_index_pointer",
            "early_edit_keeps_index",
        ),
        also=("head_keeps_chain", "depth_grows_over_requests", "draft_cache_ignores_k"),
    ),
    Invariant(
        id="drafter.no-mutation",
        subject="drafter",
        summary="the context passed in is unchanged",
        draws=_DRAFTER_DRAWS + "; every call of a session of requests (new prompt, edit, shorter prefix, user turn), "
        "and the earlier requests' lists after it",
        check=_check_no_mutation,
        draw=_draw_drafter_example,
        zoo=("mutates_input", "mutates_on_later_request"),
    ),
    Invariant(
        id="drafter.features",
        subject="drafter",
        summary="a feature drafter's proposal after any accepts and rejects equals a fresh drafter's given the "
        "accepted context and its features (its own KV and carried features rolled back), and the one it makes "
        "computing the features itself",
        needs=("feature_layers", "feature_target_spec"),
        draws="a context, then rounds of (k, draft tokens accepted, bonus token), sometimes an edited request "
        "reusing half the context; features from a fresh copy of the drafter's feature_target_spec",
        check=_check_features,
        draw=_draw_features_example,
        zoo=("head_keeps_chain",),
    ),
    Invariant(
        id="drafter.tree-well-formed",
        subject="drafter",
        summary="a tree drafter's `propose_tree` answers, at every call, a tree of parents before children, "
        "ids in `[0, vocab_size)`, at most the call's `max_nodes` nodes and `max_depth` levels",
        needs=("tree_drafter",),
        draws="a context and 1-6 calls on its growing prefixes, each with a node budget (0-24) and a depth (0-6)",
        check=_check_tree_drafter,
        draw=_draw_tree_drafter_example,
        zoo=("tree_drafter_child_before_parent", "tree_drafter_over_budget"),
    ),
    Invariant(
        id="drafter.tree-deterministic",
        subject="drafter",
        summary="a tree drafter's tree depends only on the context and the call's budget: called along growing "
        "prefixes, every tree equals a fresh drafter's",
        needs=("tree_drafter",),
        draws="a context and 1-6 calls on its growing prefixes, each with a node budget (0-24) and a depth (0-6); "
        "each call also asked of a fresh drafter",
        check=_check_tree_drafter_deterministic,
        draw=_draw_tree_drafter_example,
        zoo=("tree_drafter_left_on_last_branch",),
    ),
    Invariant(
        id="target.shape",
        subject="target",
        summary="logits are `[q, vocab_size]` and finite",
        draws=_TARGET_DRAWS,
        check=_target_check(target_checks.check_shape),
        draw=_draw_target_example,
        zoo=("pads_vocab",),
    ),
    Invariant(
        id="target.processed",
        subject="target",
        summary="a forward advances `processed` by `q`; restore sets it back",
        draws=_TARGET_DRAWS,
        check=_target_check(target_checks.check_processed),
        draw=_draw_target_example,
        zoo=("processed_is_last_index",),
    ),
    Invariant(
        id="target.chunk-invariance",
        subject="target",
        summary="one forward of q tokens equals q one-token forwards (and any chunking): exact, or within `atol`",
        draws=_TARGET_DRAWS + ", and a chunking of them",
        check=_check_chunks,
        draw=_draw_target_example,
        zoo=("chunked_forward_differs",),
    ),
    Invariant(
        id="target.causality",
        subject="target",
        summary="row i does not depend on tokens after i",
        draws=_TARGET_DRAWS + ", a split point and replacement tokens after it",
        check=_check_causality,
        draw=_draw_target_example,
        zoo=("mask_leaks_next_token",),
    ),
    Invariant(
        id="target.restore",
        subject="target",
        summary="after restore, the next forwards equal a fresh target fed the same prefix",
        draws=_TARGET_DRAWS + ", and 1-3 probe tokens",
        check=_check_restore_like(target_checks.check_restore),
        draw=_draw_target_example,
        zoo=("restore_forgets_conv", "restore_forgets_rec"),
    ),
    Invariant(
        id="target.checkpoints",
        subject="target",
        summary="checkpoint i behaves as (and, white-box, equals) the snapshot after i+1 tokens",
        needs=("forward_with_checkpoints",),
        draws=_TARGET_DRAWS + ", and 1-3 probe tokens",
        check=_check_restore_like(target_checks.check_checkpoints),
        draw=_draw_target_example,
        zoo=("checkpoints_off_by_one",),
        also=("restore_forgets_conv", "restore_forgets_rec"),
    ),
    Invariant(
        id="target.matches-source",
        subject="target",
        summary="every row of the target's logits (the prefix in one forward, the tokens chunked) is within `atol + "
        "rtol x` its largest logit of the source model's (`--oracle SPEC`, or the target's `source_spec`), up to a "
        "router near-tie",
        needs=("source",),
        draws=_TARGET_DRAWS + ", and a chunking of them; the source fed everything in one forward",
        check=_check_source,
        draw=_draw_target_example,
        zoo=("drifts_from_source",),
    ),
    Invariant(
        id="target.capacity",
        subject="target",
        summary="a forward past `max_context` raises a clear error and changes nothing",
        draws="a filling pattern and 2-5 tokens of overflow (few examples: filling is costly)",
        budget="capacity",
        check=_check_capacity,
        draw=_draw_target_example,
        zoo=("capacity_wraps",),
        also=("restore_forgets_conv", "restore_forgets_rec"),
    ),
    Invariant(
        id="engine.lossless",
        subject="engine",
        summary="the emitted tokens equal plain greedy's (tie-aware); every generation completes",
        needs=("oracle",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        on_record=_lossless,
        completes=True,
        zoo=("stale_state_after_zero_draft", "raises_every_call", "leaks_placeholder_id"),
        also=(
            "chunked_forward_differs",
            "restore_forgets_conv",
            "restore_forgets_rec",
            "too_long",
            "out_of_range",
            "checkpoints_off_by_one",
            "returns_generator",
            "forgets_recurrent_restore",
            "processed_off_by_one",
            "accepts_past_mismatch",
            "emits_after_eos",
            "refeeds_accepted_first",
            "eos_masked_by_length_cap",
            "length_cap_hides_eos_in_block",
            "trusts_overlong_draft",
        ),
    ),
    Invariant(
        id="engine.accept-bounds",
        subject="engine",
        summary="`1 <= len(accepted) <= len(draft) + 1 <= k + 1`",
        needs=("steps",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        on_record=_on_record(
            _accept_bounds,
            _rounds,
            lambda r: f"1 <= accepted <= draft + 1 <= k + 1 = {r.k + 1} in all {_rounds(r)} rounds",
        ),
        zoo=("drafts_past_k",),
        also=("too_long", "out_of_range", "checkpoints_off_by_one", "returns_generator", "trusts_overlong_draft"),
    ),
    Invariant(
        id="engine.accept-rule",
        subject="engine",
        summary="`accepted == draft[:j] + [argmax[j]]`, j the longest matching prefix",
        needs=("steps",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        on_record=_on_record(
            _accept_rule, _rounds, lambda r: f"accepted == draft[:j] + [argmax[j]] in all {_rounds(r)} rounds"
        ),
        zoo=("accepts_past_mismatch", "drops_bonus_token"),
        also=("too_long", "out_of_range", "checkpoints_off_by_one", "returns_generator"),
    ),
    Invariant(
        id="engine.kv-length",
        subject="engine",
        summary="`processed == base + len(accepted)` every round, `== len(ctx) - 1` at the end",
        needs=("steps",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        on_record=_on_record(
            _kv_length,
            _rounds,
            lambda r: (
                "processed == base + accepted in every round; "
                f"{len(r.prompt) + len(r.generation.tokens) - 1} at the end"
            ),
        ),
        zoo=("processed_off_by_one", "decode_last_round_keeps_rejected"),
        also=("too_long", "out_of_range", "checkpoints_off_by_one", "returns_generator", "drops_last_step_at_eos"),
    ),
    Invariant(
        id="engine.state-restored",
        subject="engine",
        summary="after every round the live target's state is the state plain decoding of `ctx[:-1]` gives "
        "(at every proposal when the suite drafts, and after the generation)",
        needs=("target",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        on_record=_state_restored,
        zoo=("forgets_recurrent_restore", "refeeds_accepted_first"),
        also=(
            "restore_forgets_conv",
            "restore_forgets_rec",
            "too_long",
            "out_of_range",
            "checkpoints_off_by_one",
            "returns_generator",
            "processed_off_by_one",
            "stale_state_after_zero_draft",
        ),
    ),
    Invariant(
        id="engine.stop",
        subject="engine",
        summary="exactly `max_new_tokens`; nothing after the first EOS; never past `max_context`",
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        on_record=_on_record(_stop, lambda r: 1, _stop_held),
        zoo=("emits_after_eos", "eos_masked_by_length_cap", "length_cap_hides_eos_in_block", "trusts_overlong_draft"),
        also=("too_long", "out_of_range", "checkpoints_off_by_one", "returns_generator"),
    ),
    Invariant(
        id="engine.cost",
        subject="engine",
        summary="checkpoint: target forwards == rounds (+ prefill); replay: at most one replay per rejecting round; "
        "every round emits >= 1 token",
        needs=("stats", "rollback"),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        on_record=_on_record(
            _cost, _rounds, lambda r: f"target forwards fit rollback={r.rollback} over {_rounds(r)} rounds"
        ),
        zoo=("replays_despite_checkpoints",),
        also=("too_long", "out_of_range", "checkpoints_off_by_one", "returns_generator", "drops_last_step_at_eos"),
    ),
    Invariant(
        id="trace.consistency",
        subject="engine",
        summary="`tokens` is the concatenated `accepted`, truncated as the stop reason says",
        needs=("steps",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        on_record=_on_record(
            _consistency, _rounds, lambda r: "tokens == the rounds' accepted tokens, cut as the stop reason says"
        ),
        zoo=("drops_last_step_at_eos",),
        also=(
            "too_long",
            "out_of_range",
            "checkpoints_off_by_one",
            "returns_generator",
            "emits_after_eos",
            "eos_masked_by_length_cap",
            "length_cap_hides_eos_in_block",
            "trusts_overlong_draft",
        ),
    ),
    Invariant(
        id="engine.features",
        subject="engine",
        summary="at every proposal the engine hands a feature drafter the target's features of exactly the "
        "accepted positions (`ctx[:-1]`): none of a rejected draft position, none shifted, the declared layers, "
        "none left from an earlier request",
        needs=("drafter", "forward_with_features"),
        draws=_ENGINE_DRAWS + "; the installed drafter declares the subject's (or the engine's own drafter's) "
        "feature_layers and the features are compared with a fresh copy of the model",
        driver="engine-case",
        on_record=_features,
        zoo=("feature_from_rejected", "features_shifted", "features_wrong_layer", "features_stale_across_requests"),
    ),
    Invariant(
        id="engine.drafts-used",
        subject="engine",
        summary="every round verifies the draft the suite's drafter sent (cut to the k asked for, or before an id "
        "outside the vocabulary), and an engine the suite set a drafter on asks for its drafts",
        needs=("steps", "suite_drafts"),
        draws=_ENGINE_DRAWS + "; hostile drafts (longer than k, out of range) that the engine must cut or refuse",
        driver="engine-case",
        on_record=_drafts_used,
        zoo=("ignores_suite_drafts", "verifies_own_draft"),
    ),
    Invariant(
        id="stateful.rollback-machine",
        subject="engine",
        summary="interleaved speculative rounds of every kind, plain steps, snapshot/restore round trips, user "
        "turns and resets keep `engine.kv-length`, `engine.state-restored` and losslessness after every step",
        needs=("builtin",),
        draws="a RuleBasedStateMachine over the target with the built-in decoder",
        driver="rollback-machine",
        zoo=("reset_keeps_conv",),
    ),
    Invariant(
        id="engine.session",
        subject="engine",
        summary="requests on one live engine (new prompt, regenerate, an edit sharing a prefix, a user turn, a "
        "shorter prefix, other max_new_tokens / EOS) each equal plain greedy; the `prefix_reused` an engine "
        "that declares a cache reports is never more than it can hold and never nothing on a user turn; a feature "
        "drafter is handed the target's features of exactly the accepted positions on every request",
        needs=("oracle", "sessions"),
        draws="a RuleBasedStateMachine whose rules are requests on one engine instance; a failure shows, and "
        "its reproduce command replays, the whole request history",
        driver="session-machine",
        zoo=(
            "stale_prefix_cache",
            "snapshot_only_last_call",
            "never_reuses_prefix",
            "overclaims_prefix_reuse",
            "prefix_hit_zero_features",
            "prefix_hit_stale_features",
            "block_cache_without_prefix",
            "session_penalties_carried_over",
        ),
        also=(
            "forgets_recurrent_restore",
            "processed_off_by_one",
            "accepts_past_mismatch",
            "emits_after_eos",
            "stale_state_after_zero_draft",
            "refeeds_accepted_first",
            "eos_masked_by_length_cap",
            "raises_every_call",
            "length_cap_hides_eos_in_block",
        ),
    ),
    # ---------------------------------------------------------------- sampling (driver "sampling", --sampling)
    Invariant(
        id="drafter.proposal-distribution",
        subject="drafter",
        summary="a sampling drafter's tokens are distributed as the q rows it declares",
        draws=_SAMPLING_DRAFTER_DRAWS,
        driver="sampling",
        check=_drafter_sampling_check,
        zoo=("q_from_raw_logits",),
    ),
    Invariant(
        id="engine.sampled-distribution",
        subject="engine",
        summary=(
            "sampled output has plain sampling's distribution (event tests and an all-token PIT test; "
            "false-fail bound 1e-6 per engine case)"
        ),
        draws=_SAMPLING_DRAWS,
        driver="sampling",
        check=_sampling_check(
            lambda inv, j: sampling_checks.check_sampled_distribution(
                inv, j.search, tv_target=j.plan.profile.sampling_tv
            ),
            shortfall=True,
        ),
        zoo=("argmax_verification", "q_of_next_position", "matches_argmax_at_last_position"),
        also=("residual_from_p",),
    ),
    Invariant(
        id="engine.sampled-support",
        subject="engine",
        summary="no emitted token has p = 0; a replacement differs from the draft token it replaced",
        draws=_SAMPLING_DRAWS,
        driver="sampling",
        check=_sampling_check(
            lambda inv, j: sampling_checks.check_sampled_support(inv, j.search, tolerance=j.case.atol)
        ),
        zoo=(
            "residual_from_p",
            "unfiltered_sampling",
            "unnormalized_residual",
            "bonus_from_wrong_row",
            "samples_padded_vocab",
        ),
    ),
    Invariant(
        id="engine.sampled-rounds",
        subject="engine",
        summary="round bounds, KV length, stop rule and costs hold on sampled generations",
        needs=("steps",),
        draws=_SAMPLING_DRAWS,
        driver="sampling",
        check=_sampling_check(
            lambda inv, j: sampling_checks.check_sampled_rounds(
                inv, j.search, k=j.case.k or (4 if j.case.kind == "builtin" else None), rollback=j.case.rollback
            )
        ),
        zoo=("sampled_counts_replacement", "bonus_after_accepted_eos"),
    ),
    Invariant(
        id="engine.seeds",
        subject="engine",
        summary="one seed gives one output (`seeded`); different seeds give independent outputs",
        draws=_SAMPLING_DRAWS,
        driver="sampling",
        check=_sampling_check(lambda inv, j: sampling_checks.check_seeds(inv, j.search)),
        zoo=("shared_rng_stream", "broadcast_seed", "unseeded_drafter_rng", "drafter_ignores_rng"),
        also=("argmax_verification",),
    ),
    Invariant(
        id="engine.greedy-limit",
        subject="engine",
        summary="`temperature = 0` and `top_k = 1` equal plain greedy exactly",
        needs=("oracle",),
        draws=_SAMPLING_DRAWS,
        driver="sampling",
        check=_sampling_check(
            lambda inv, j: sampling_checks.check_greedy_limit(
                inv, j.search, j.greedy, tie_tolerance=j.case.tie_tolerance
            )
        ),
        zoo=("greedy_limit_samples",),
        also=("bonus_from_wrong_row", "unfiltered_sampling"),
    ),
    *_BATCH_REGISTRY,
    *_DECODE_REGISTRY,
    *_GRAMMAR_REGISTRY,
    *_GRAMMAR_SAMPLED_REGISTRY,
    *_DECODE_OUTPUT_REGISTRY,
    *_DECODE_SESSION_REGISTRY,
    *_TREE_REGISTRY,
)

_BY_ID = {inv.id: inv for inv in REGISTRY}
assert len(_BY_ID) == len(REGISTRY), "duplicate invariant id"


def get(invariant_id: str) -> Invariant:
    try:
        return _BY_ID[invariant_id]
    except KeyError:
        raise UsageError(_unknown(invariant_id)) from None


def by_subject(subject: Subject) -> tuple[Invariant, ...]:
    return tuple(inv for inv in REGISTRY if inv.subject == subject)


def _unknown(pattern: str) -> str:
    close = get_close_matches(pattern, list(_BY_ID), n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"--only {pattern!r} matches no invariant id{hint} (`specproof invariants` lists them)"


def select(patterns: Iterable[str]) -> tuple[str, ...]:
    """The ids ``--only`` selects: ids or globs, comma-separated or repeated; unknown ones are a ``UsageError``."""
    wanted: list[str] = []
    for item in patterns:
        for pattern in (p.strip() for p in str(item).split(",")):
            if not pattern:
                continue
            hits = [i for i in _BY_ID if fnmatch.fnmatchcase(i, pattern)]
            if not hits:
                raise UsageError(_unknown(pattern))
            wanted += [h for h in hits if h not in wanted]
    return tuple(i for i in _BY_ID if i in wanted)


def markdown_table(invariants: Sequence[Invariant] = REGISTRY) -> str:
    """The README's invariant table (a test keeps the README equal to this)."""
    lines = ["| id | what must hold | needs |", "|---|---|---|"]
    for inv in invariants:
        needs = ", ".join(f"`{n}`" for n in inv.needs) or "—"
        lines.append(f"| `{inv.id}` | {inv.summary} | {needs} |")
    return "\n".join(lines)


def registry_json() -> str:
    return json.dumps([inv.to_json() for inv in REGISTRY], indent=2)


def check_generation(
    generation: Generation,
    *,
    prompt: Sequence[int],
    k: int,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    max_context: int | None = None,
    rollback: str | None = None,
    final_processed: int | None = None,
) -> dict[str, list[Violation]]:
    """Every engine invariant that applies to a generation on its own (no oracle, no live state).

    Returns ``{invariant id: violations}`` (an empty list: checked and held); an id that is
    absent did not apply: without ``steps`` (a black-box engine) only the stop check and,
    with ``stats`` and a rollback strategy, the cost check apply. ``prompt`` is the context
    when the call started (the prompt for a fresh generation).
    """
    if len(prompt) < 1:
        raise InvalidSettingError("prompt is empty: a generation needs at least the pending token")
    caps = Capabilities(has=set()).with_(
        steps=generation.steps is not None or "no steps",
        stats=generation.stats is not None or "no stats",
        rollback=rollback is not None or "no rollback strategy",
    )
    record = RunRecord(
        generation=generation,
        prompt=tuple(prompt),
        k=k,
        max_new_tokens=max_new_tokens,
        eos=eos_token_id,
        max_context=max_context,
        rollback=rollback,
        final_processed=final_processed,
        capabilities=caps,
    )
    out: dict[str, list[Violation]] = {}
    for inv in REGISTRY:
        if inv.on_record is not None and inv.applies(caps) is None:
            out[inv.id] = inv.on_record(inv, record).violations
    return out
