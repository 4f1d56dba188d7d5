"""The invariant registry: the one place each check's id, subject, summary, needs and check live.

Everything else is derived from ``REGISTRY``: the per-subject lists, the pytest
parametrization and ids, ``--only``, report rows, the zoo's expected ids, the README's
invariant table and ``specproof invariants``. Adding an invariant means adding one entry.

Every check has one signature, ``check(case, example) -> Outcome``: ``case`` is the
resolved subject it runs on, ``example`` what its driver drew (drafter and target
invariants draw their own examples with ``draw(data, case, profile)``; engine
invariants share one search per engine case, and their example is the ``EngineRun``
it produced). ``Outcome.exercised`` counts what reached the check (calls compared,
rounds checked, ...): zero exercising examples make the check a ``skip``, never a pass.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Sequence
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any, Literal

import attrs
from hypothesis import strategies as st

from specproof.conformance.checks import drafter as drafter_checks
from specproof.conformance.checks import features as feature_checks
from specproof.conformance.checks import target as target_checks
from specproof.contract import UsageError, Violation
from specproof.strategies import contexts

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._harness import EngineRun
    from specproof.conformance._profiles import Profile

__all__ = [
    "REGISTRY",
    "Invariant",
    "Outcome",
    "Subject",
    "by_subject",
    "get",
    "markdown_table",
    "registry_json",
    "select",
]

Subject = Literal["drafter", "target", "engine"]
Driver = Literal["examples", "engine-case", "rollback-machine", "session-machine"]


@attrs.frozen
class Outcome:
    """What one check made of one example: the violations found and how much it exercised."""

    violations: list[Violation] = attrs.Factory(list)
    exercised: int = 1
    note: str = ""  # why nothing was exercised, when exercised == 0


@attrs.frozen(kw_only=True)
class Invariant:
    """One registered check.

    ``needs`` names what the subject must expose for the check to apply (see
    docs/contract.md, "capabilities"); ``draws`` says in words how its examples are drawn;
    ``driver`` which search runs it (``examples``: its own Hypothesis search over
    ``draw``; ``engine-case``: the one search per engine case; the two state machines).
    """

    id: str
    subject: Subject
    summary: str
    needs: tuple[str, ...] = ()
    draws: str
    driver: Driver = "examples"
    budget: Literal["examples", "capacity"] = "examples"  # capacity: a few examples (filling a target is costly)
    check: Callable[[Any, Any], Outcome] | None = attrs.field(default=None, eq=False, repr=False)
    draw: Callable[[st.DataObject, Any, Profile], Any] | None = attrs.field(default=None, eq=False, repr=False)

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
    return {"context": ctx, "ks": ks, "other": other, "called": calls}


def _drafter_check(fn: Callable[..., list[Violation]]) -> Callable[[Any, Any], Outcome]:
    def check(case: Any, ex: dict[str, Any]) -> Outcome:
        return Outcome(fn(case.make(), ex["context"], ex["ks"]))

    return check


def _check_token_range(case: Any, ex: dict[str, Any]) -> Outcome:
    return Outcome(drafter_checks.check_token_range(case.make(), ex["context"], ex["ks"], vocab_size=case.vocab_size))


def _check_deterministic(case: Any, ex: dict[str, Any]) -> Outcome:
    vs, compared = drafter_checks.check_deterministic(
        case.make, ex["context"], ex["ks"], other=ex["other"], called=ex["called"]
    )
    return Outcome(vs, exercised=compared, note="" if compared else "no call could be compared")


def _draw_features_example(data: st.DataObject, case: Any, profile: Profile) -> dict[str, Any]:
    vocab = case.vocab_size
    ctx = data.draw(contexts(vocab, min_size=2, max_size=profile.max_prompt * 2), label="context")
    rounds = data.draw(st.integers(1, 6), label="rounds")
    ks = data.draw(st.lists(st.integers(1, 6), min_size=rounds, max_size=rounds), label="k per round")
    accepts = data.draw(st.lists(st.integers(0, 6), min_size=rounds, max_size=rounds), label="draft tokens accepted")
    bonus = data.draw(st.lists(st.integers(0, vocab - 1), min_size=rounds, max_size=rounds), label="bonus tokens")
    edit_at = data.draw(st.one_of(st.none(), st.integers(1, max(1, rounds - 1))), label="edited request at round")
    return {"context": ctx, "ks": ks, "accepts": accepts, "bonus": bonus, "edit_at": edit_at}


def _check_features(case: Any, ex: dict[str, Any]) -> Outcome:
    vs, compared, note = feature_checks.check_drafter_features(
        case.make, ex["context"], ex["ks"], ex["accepts"], ex["bonus"], edit_at=ex["edit_at"]
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


def _target_check(name: str) -> Callable[[Any, Any], Outcome]:
    def check(case: Any, ex: dict[str, Any]) -> Outcome:
        fn = target_checks.TARGET_CHECKS[name]
        return Outcome(fn(case.make, ex["prefix"], ex["tokens"]))

    return check


def _check_chunks(case: Any, ex: dict[str, Any]) -> Outcome:
    chunks = ex["data"].draw(st.lists(st.integers(1, 4), min_size=1, max_size=6), label="chunks")
    return Outcome(
        target_checks.check_chunk_invariance(case.make, ex["prefix"], ex["tokens"], chunks, tolerance=case.atol)
    )


def _check_causality(case: Any, ex: dict[str, Any]) -> Outcome:
    data, tokens = ex["data"], ex["tokens"]
    split = data.draw(st.integers(1, len(tokens)), label="split")
    repl = data.draw(
        st.lists(st.integers(0, case.vocab_size - 1), min_size=len(tokens), max_size=len(tokens)), label="replacement"
    )
    return Outcome(target_checks.check_causality(case.make, ex["prefix"], tokens, split, repl, tolerance=case.atol))


def _check_restore_like(fn: Callable[..., list[Violation]]) -> Callable[[Any, Any], Outcome]:
    def check(case: Any, ex: dict[str, Any]) -> Outcome:
        probe = ex["data"].draw(st.lists(st.integers(0, case.vocab_size - 1), min_size=1, max_size=3), label="probe")
        return Outcome(fn(case.make, ex["prefix"], ex["tokens"], probe, tolerance=case.atol))

    return check


def _check_capacity(case: Any, ex: dict[str, Any]) -> Outcome:
    overflow = ex["data"].draw(st.integers(2, 5), label="overflow tokens")
    fill = ex["prefix"] or ex["tokens"]
    return Outcome(target_checks.check_capacity(case.make, fill, overflow, ex["tokens"][0]))


# ---------------------------------------------------------------- engine invariants


def _engine_check(invariant_id: str, exercised: Callable[[EngineRun], int]) -> Callable[[Any, Any], Outcome]:
    """An engine invariant judged on one shared run: its verdict, and what of the run reached it."""

    def check(case: Any, run: EngineRun) -> Outcome:
        if not run.completed and invariant_id != "engine.lossless":
            # A generation that did not complete passes nothing: it fails every check that was
            # asked about it, naming the component that broke it (engine.lossless says the same).
            broken = run.verdicts.get("engine.lossless") or []
            why = broken[0].explanation if broken else f"the generation did not complete: {run.error}"
            return Outcome(
                [
                    Violation(
                        invariant=invariant_id,
                        explanation=f"{why} (so {invariant_id} could not be checked)",
                        example=dict(run.example),
                    )
                ],
                exercised=1,
            )
        vs = run.verdicts.get(invariant_id)
        if vs is None:
            return Outcome([], exercised=0, note=run.not_applicable.get(invariant_id, "not applicable"))
        n = exercised(run)
        return Outcome(list(vs), exercised=n if not vs else max(n, 1), note="" if n else "nothing reached it")

    return check


def _rounds(run: EngineRun) -> int:
    return run.rounds


def _drafted_rounds(run: EngineRun) -> int:
    return run.rounds - run.paths.get("empty_draft", 0)


def _one(run: EngineRun) -> int:
    return 1


def _state_checks(run: EngineRun) -> int:
    return run.state_checks


_DRAFTER_DRAWS = (
    "an unrelated context (drawn first, up to 3x the prompt length), then a context and the k of each call; "
    "the drafter is called on growing prefixes as a decoder calls it"
)
_TARGET_DRAWS = "a prefix (adversarial contexts) and 1-9 tokens fed after it"
_ENGINE_DRAWS = (
    "one search per engine case: k, max_new_tokens, a prompt (sometimes ending near max_context), EOS drawn "
    "among the greedy continuation (often among its last k+1 tokens), and the suite's scripted drafter "
    "(round plans reaching every path) or the subject's own"
)

REGISTRY: tuple[Invariant, ...] = (
    Invariant(
        id="drafter.max-length",
        subject="drafter",
        summary="`len(draft) <= k`; `k == 0` gives `[]`",
        draws=_DRAFTER_DRAWS,
        check=_drafter_check(lambda d, c, ks: drafter_checks.check_max_length(d, c, ks)),
        draw=_draw_drafter_example,
    ),
    Invariant(
        id="drafter.token-range",
        subject="drafter",
        summary="the draft is a sequence (list, tuple, 1-D array) of ints in `[0, vocab_size)`",
        draws=_DRAFTER_DRAWS,
        check=_check_token_range,
        draw=_draw_drafter_example,
    ),
    Invariant(
        id="drafter.deterministic",
        subject="drafter",
        summary="the draft depends only on the context passed in and k: not on earlier calls, "
        "nor (after `reset()`) on earlier generations",
        draws=_DRAFTER_DRAWS + "; a second drafter is called at only some positions, a third after reset()",
        check=_check_deterministic,
        draw=_draw_drafter_example,
    ),
    Invariant(
        id="drafter.no-mutation",
        subject="drafter",
        summary="the context passed in is unchanged",
        draws=_DRAFTER_DRAWS,
        check=_drafter_check(lambda d, c, ks: drafter_checks.check_no_mutation(d, c, ks)),
        draw=_draw_drafter_example,
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
    ),
    Invariant(
        id="target.shape",
        subject="target",
        summary="logits are `[q, vocab_size]` and finite",
        draws=_TARGET_DRAWS,
        check=_target_check("target.shape"),
        draw=_draw_target_example,
    ),
    Invariant(
        id="target.processed",
        subject="target",
        summary="a forward advances `processed` by `q`; restore sets it back",
        draws=_TARGET_DRAWS,
        check=_target_check("target.processed"),
        draw=_draw_target_example,
    ),
    Invariant(
        id="target.chunk-invariance",
        subject="target",
        summary="one forward of q tokens equals q one-token forwards (and any chunking): exact, or within `atol`",
        draws=_TARGET_DRAWS + ", and a chunking of them",
        check=_check_chunks,
        draw=_draw_target_example,
    ),
    Invariant(
        id="target.causality",
        subject="target",
        summary="row i does not depend on tokens after i",
        draws=_TARGET_DRAWS + ", a split point and replacement tokens after it",
        check=_check_causality,
        draw=_draw_target_example,
    ),
    Invariant(
        id="target.restore",
        subject="target",
        summary="after restore, the next forwards equal a fresh target fed the same prefix",
        draws=_TARGET_DRAWS + ", and 1-3 probe tokens",
        check=_check_restore_like(target_checks.check_restore),
        draw=_draw_target_example,
    ),
    Invariant(
        id="target.checkpoints",
        subject="target",
        summary="checkpoint i behaves as (and, white-box, equals) the snapshot after i+1 tokens",
        needs=("forward_with_checkpoints",),
        draws=_TARGET_DRAWS + ", and 1-3 probe tokens",
        check=_check_restore_like(target_checks.check_checkpoints),
        draw=_draw_target_example,
    ),
    Invariant(
        id="target.capacity",
        subject="target",
        summary="a forward past `max_context` raises a clear error and changes nothing",
        draws="a filling pattern and 2-5 tokens of overflow (few examples: filling is costly)",
        budget="capacity",
        check=_check_capacity,
        draw=_draw_target_example,
    ),
    Invariant(
        id="engine.lossless",
        subject="engine",
        summary="the emitted tokens equal plain greedy's (tie-aware); every generation completes",
        needs=("oracle",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        check=_engine_check("engine.lossless", _one),
    ),
    Invariant(
        id="engine.accept-bounds",
        subject="engine",
        summary="`1 <= len(accepted) <= len(draft) + 1 <= k + 1`",
        needs=("steps",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        check=_engine_check("engine.accept-bounds", _rounds),
    ),
    Invariant(
        id="engine.accept-rule",
        subject="engine",
        summary="`accepted == draft[:j] + [argmax[j]]`, j the longest matching prefix",
        needs=("steps",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        check=_engine_check("engine.accept-rule", _rounds),
    ),
    Invariant(
        id="engine.kv-length",
        subject="engine",
        summary="`processed == base + len(accepted)` every round, `== len(ctx) - 1` at the end",
        needs=("steps",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        check=_engine_check("engine.kv-length", _rounds),
    ),
    Invariant(
        id="engine.state-restored",
        subject="engine",
        summary="after every round the live target's state is the state plain decoding of `ctx[:-1]` gives "
        "(at every proposal when the suite drafts, and after the generation)",
        needs=("target",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        check=_engine_check("engine.state-restored", _state_checks),
    ),
    Invariant(
        id="engine.stop",
        subject="engine",
        summary="exactly `max_new_tokens`; nothing after the first EOS; never past `max_context`",
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        check=_engine_check("engine.stop", _one),
    ),
    Invariant(
        id="engine.cost",
        subject="engine",
        summary="checkpoint: target forwards == rounds (+ prefill); replay: at most one replay per rejecting round; "
        "every round emits >= 1 token",
        needs=("stats", "rollback"),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        check=_engine_check("engine.cost", _rounds),
    ),
    Invariant(
        id="trace.consistency",
        subject="engine",
        summary="`tokens` is the concatenated `accepted`, truncated as the stop reason says",
        needs=("steps",),
        draws=_ENGINE_DRAWS,
        driver="engine-case",
        check=_engine_check("trace.consistency", _rounds),
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
        check=_engine_check("engine.features", lambda run: run.feature_checks),
    ),
    Invariant(
        id="stateful.rollback-machine",
        subject="engine",
        summary="interleaved speculative rounds of every kind, plain steps, snapshot/restore round trips, user "
        "turns and resets keep `engine.kv-length`, `engine.state-restored` and losslessness after every step",
        needs=("builtin",),
        draws="a RuleBasedStateMachine over the target with the built-in decoder",
        driver="rollback-machine",
    ),
    Invariant(
        id="engine.session",
        subject="engine",
        summary="requests on one live engine (new prompt, regenerate, an edit sharing a prefix, a user turn, a "
        "shorter prefix, other max_new_tokens / EOS) each equal plain greedy",
        needs=("oracle",),
        draws="a RuleBasedStateMachine whose rules are requests on one engine instance; a failure shows, and "
        "its reproduce command replays, the whole request history",
        driver="session-machine",
    ),
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
