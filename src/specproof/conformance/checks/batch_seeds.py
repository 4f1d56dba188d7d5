"""``batch.seeds``: seeds in batches (docs/contract.md, "Batches").

Two parts, judged on each drawn schedule:

- **reproduction** (where the engine declares ``batch_invariant_seeding``): the schedule's first
  request, seeded, emits the tokens it emits run alone on a fresh engine, beside neighbours that are
  seeded with other seeds, sampled with no seed, and greedy. Token equality: no statistics. An engine
  that does not declare it is held to its solo run in distribution only, which
  ``batch.sampled-distribution`` judges in batches (and the sampling checks on the solo engine);
  this part then says so and judges nothing.
- **independence** (every batched engine, where the suite has the model): ``TRIALS`` batches, each
  of two *unseeded* sampled requests with one prompt. Under a correct engine the second stream ``B``
  is drawn independently of the first ``A``, so given ``A``, ``B`` opens with ``A``'s first ``m``
  tokens with probability exactly ``pi = p(A[:m])``, the product of the target's processed
  probabilities of those tokens (after the request's decode processors, where it has any: computed
  here on a fresh copy of the model, never by the engine);
  ``m`` is the shortest opening with ``pi <= CHANCE`` (all of ``A`` where none is). The trials are
  independent, so the number of repeated openings is Poisson-binomial with those ``pi``; the check
  fails when its exact upper tail (``upper_tail``, the Poisson-binomial law by convolution; the
  tests compare it with ``scipy.stats.poisson_binom``) is at most ``seed_alpha``. The driver
  gives the n-th schedule ``schedule_alpha(n, FALSE_FAIL_BOUND)``; those shares sum to the bound
  over any number of schedules, so a run of a correct engine fails with probability at most
  ``FALSE_FAIL_BOUND`` however many schedules Hypothesis judges (a union bound).
  The bound assumes the engine samples from ``p`` (``sampling.*`` judge that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from specproof.conformance.checks.batch import BatchSubject, request_of, run_failed, run_schedule
from specproof.contract import BatchRequest, DecodeParams, SamplingParams, Violation, run_alone
from specproof.contract.decode_state import scored_rows
from specproof.contract.sampling import processed_distribution
from specproof.strategies import BatchSchedule, ScheduledRequest

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = [
    "CHANCE",
    "TRIALS",
    "check_seeds",
    "detectable_copy_rate",
    "opening_chance",
    "schedule_alpha",
    "upper_tail",
]

Result = tuple[list[Violation], int, str]
TRIALS = 4  # same-prompt unseeded pairs per schedule
CHANCE = 0.001  # a repeated opening is judged on the shortest one this unlikely under p
MIN_NEW_TOKENS = 16  # the pairs' length: long enough that an opening is unlikely by chance on a peaked model
NEIGHBOURS = ("seeded with other seeds", "sampled with no seed", "greedy")


def schedule_alpha(index: int, bound: float) -> float:
    """The ``index``-th schedule's (from 1) share of ``bound``: ``6 bound / (pi^2 index^2)``, summing to
    ``bound`` over all indices (so no count of schedules need be known in advance)."""
    return 6.0 * bound / (math.pi**2 * max(int(index), 1) ** 2)


def check_seeds(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """``batch.seeds``: a seeded request reproduces whatever its neighbours' seeds are; unseeded
    requests with one prompt in one batch repeat each other no more often than chance allows."""
    calm = schedule.calm()
    found: list[Violation] = []
    exercised = 0
    notes: list[str] = []
    if subject.capabilities.batch_invariant_seeding:
        found, exercised = _reproduction(inv, subject, calm)
    else:
        notes.append(
            "the engine does not declare batch_invariant_seeding: a seeded request is held to its solo run in "
            "distribution only (batch.sampled-distribution judges that in batches), not token by token"
        )
    if not found:
        more, pairs, note = _independence(inv, subject, calm)
        found, exercised = more, exercised + pairs
        notes.append(note)
    return found, exercised or int(bool(found)), "; ".join(n for n in notes if n)


def _reproduction(inv: Invariant, subject: BatchSubject, calm: BatchSchedule) -> tuple[list[Violation], int]:
    """The first request, seeded, beside each kind of neighbour, against itself run alone."""
    first = calm.requests[0]
    seed = first.seed if first.seed is not None else 1_000_003
    neighbours = calm.requests[1:] or (attrs.evolve(first, seed=None),)  # one same-prompt neighbour at least
    specs = (attrs.evolve(first, seed=seed), *neighbours)
    try:
        alone = run_alone(
            subject.make_engine(), _requests(subject, specs, seed, "")[0], max_steps=first.max_new_tokens + 2
        )
    except Exception as exc:
        return [inv.violation(f"r0 (seed {seed}) run alone raised {type(exc).__name__}: {exc}")], 1
    compared = 0
    for kind in NEIGHBOURS:
        requests = _requests(subject, specs, seed, kind)
        schedule = BatchSchedule(requests=specs)
        example = {**schedule.describe(), "r0": f"seed {seed}", "neighbours": kind}
        run = run_schedule(subject, schedule, requests=requests)
        failed = run_failed(inv, run, example)
        if failed:
            return failed, compared + 1
        compared += 1
        got = run.finished.get("r0")
        if got is None or got.tokens != alone.tokens:
            return [
                inv.violation(
                    f"r0 (seed {seed}) gave other tokens beside neighbours {kind} than run alone "
                    "(the engine declares batch_invariant_seeding)",
                    expected=list(alone.tokens),
                    actual=None if got is None else list(got.tokens),
                    example=example,
                )
            ], compared
    return [], compared


def _requests(subject: BatchSubject, specs: Sequence[ScheduledRequest], seed: int, kind: str) -> list[BatchRequest]:
    """Fresh requests (fresh scripted drafters) for ``specs``: ``r0`` sampled with ``seed``, each
    neighbour as ``kind`` says (seeded with its own other seed, sampled with none, or greedy)."""
    built = [request_of(subject, i, spec) for i, spec in enumerate(specs)]
    out = [attrs.evolve(built[0], sampling=subject.sampled.with_seed(seed))]
    for i, request in enumerate(built[1:]):
        if kind == "greedy":
            out.append(attrs.evolve(request, sampling=None))
        else:
            own = seed + 1 + i if kind.startswith("seeded") else None
            out.append(attrs.evolve(request, sampling=subject.sampled.with_seed(own)))
    return out


def _independence(inv: Invariant, subject: BatchSubject, calm: BatchSchedule) -> tuple[list[Violation], int, str]:
    """``TRIALS`` batches of two unseeded requests with one prompt: how often ``B`` repeats ``A``'s opening."""
    if subject.make_reference is None:
        return [], 0, "no model to compute an opening's probability with: unseeded independence not judged"
    first = calm.requests[0]
    spec = attrs.evolve(
        first, arrival=0, eos_at=None, seed=None, max_new_tokens=max(first.max_new_tokens, MIN_NEW_TOKENS)
    )
    schedule = BatchSchedule(requests=(spec, spec))
    unseeded = subject.sampled.with_seed(None)
    chances: list[float] = []
    hits = 0
    for trial in range(TRIALS):
        requests = [attrs.evolve(request_of(subject, i, spec), sampling=unseeded) for i in range(2)]
        example = {**schedule.describe(), "sampling": unseeded.describe(), "trial": trial}
        run = run_schedule(subject, schedule, requests=requests)
        failed = run_failed(inv, run, example)
        if failed or "r0" not in run.finished or "r1" not in run.finished:
            return failed or [inv.violation("an unseeded pair did not finish", example=example)], trial + 1, ""
        a, b = list(run.finished["r0"].tokens), list(run.finished["r1"].tokens)
        first_request = requests[0]
        chance, m = opening_chance(
            subject.make_reference(),
            list(spec.prompt),
            a,
            unseeded,
            decode=first_request.decode,
            eos_token_id=first_request.eos_token_id,
        )
        chances.append(chance)
        hits += int(b[:m] == a[:m] and m > 0)
    tail = upper_tail(chances, hits)
    note = (
        f"{hits} of {TRIALS} unseeded same-prompt pairs repeated an opening ({sum(chances):.2g} expected); "
        f"upper tail {tail:.2g} vs {subject.seed_alpha:.1g}; a copy rate of "
        f"{detectable_copy_rate(chances, subject.seed_alpha):.2f} is found with power 0.99 by this schedule"
    )
    if tail <= subject.seed_alpha:
        return (
            [
                inv.violation(
                    f"two unseeded requests with one prompt in one batch repeated each other's opening in {hits} of "
                    f"{TRIALS} batches, where independent streams do {sum(chances):.2g} times (Poisson-binomial upper "
                    f"tail {tail:.2g} <= {subject.seed_alpha:.1g}): the unseeded requests share a random stream",
                    expected=round(sum(chances), 4),
                    actual=hits,
                    example={**schedule.describe(), "sampling": unseeded.describe()},
                )
            ],
            TRIALS,
            note,
        )
    return [], TRIALS, note


def opening_chance(
    model: Any,
    prompt: Sequence[int],
    tokens: Sequence[int],
    params: SamplingParams,
    *,
    decode: DecodeParams | None = None,
    eos_token_id: int | None = None,
) -> tuple[float, int]:
    """``(pi, m)``: the probability under ``p`` (a fresh ``model``) of ``tokens``' first ``m`` tokens after
    ``prompt``, ``m`` the shortest opening with ``pi <= CHANCE`` (all of ``tokens`` where none is). ``decode``:
    the request's processors, so ``p`` is the processed one (a logit bias can make an opening near certain)."""
    if not tokens:
        return 1.0, 0
    if decode is not None:  # teacher-forced rows after the request's processors (the oracle's own)
        logits = scored_rows(model, prompt, tokens, decode=decode, eos_token_id=eos_token_id)
    else:
        model.reset()
        logits = np.asarray(model.forward([*prompt, *tokens[:-1]]))[len(prompt) - 1 :]
    chance, m = 1.0, 0
    for row, token in zip(logits, tokens, strict=True):
        chance *= float(processed_distribution(row, params)[int(token)])
        m += 1
        if chance <= CHANCE:
            break
    return chance, m


def detectable_copy_rate(chances: Sequence[float], alpha: float) -> float:
    """The smallest rate ``rho`` at which ``B`` copies ``A`` (else draws independently) that the test
    rejects with probability 0.99 (1.0 where no rate does: an opening too likely by chance)."""
    if not chances:
        return 1.0
    n = len(chances)
    need = next((x for x in range(1, n + 1) if upper_tail(chances, x) <= alpha), None)
    if need is None:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(40):  # hits >= Binomial(n, rho): power P(Binom >= need) is increasing in rho
        mid = (low + high) / 2
        low, high = (mid, high) if upper_tail([mid] * n, need) < 0.99 else (low, mid)
    return high


def upper_tail(chances: Sequence[float], hits: int) -> float:
    """``P(X >= hits)`` for ``X`` the number of successes of independent trials with these
    probabilities (the Poisson-binomial law, exact by convolution; scipy is not a runtime dependency)."""
    pmf = np.ones(1)
    for p in chances:
        pmf = np.convolve(pmf, [1.0 - float(p), float(p)])
    return float(min(1.0, pmf[max(int(hits), 0) :].sum()))
