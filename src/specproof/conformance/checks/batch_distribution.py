"""``batch.sampled-distribution``: a sampled request in a batch draws from ``p`` (docs/contract.md, "Batches").

Every batched engine, with or without batch-invariant seeding, where the suite has the model. Each
drawn schedule is run as a fixed design: a greedy neighbour long enough to outlast every other
request arrives first (so it is the first row of every round), then the schedule's requests, each sampled
with the ``--sampling`` parameters (else the batch checks' default) and a seed of its own (a fresh
one per generation of the run, so the streams are independent), with their drawn prompts, lengths,
arrivals, EOS and uneven draft plans. Every emitted token of every sampled request is scored with
the randomized PIT (``_pit.pit_values``) against ``p``, the target's processed distribution
teacher-forced on a fresh copy of the model (the suite's oracle, never the engine). Under a correct
engine those values are iid U(0, 1) whatever the neighbours, so the run accumulates them across its
schedules in one ``PitTest`` at ``FALSE_FAIL_BOUND``: DKW-Massart at each checkpoint reached, a
false fail with probability at most the bound under any stopping (``_pit``'s docstring). A run that
scores fewer tokens than the first checkpoint tests nothing: its examples exercise nothing and the
check is a skip saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from specproof.conformance._pit import FIRST, PitTest, pit_values
from specproof.conformance.checks.batch import BatchSubject, run_failed, run_schedule
from specproof.conformance.checks.generation import token_id_problem
from specproof.contract import SamplingParams, Violation
from specproof.contract.sampling import processed_distribution
from specproof.strategies import BatchSchedule

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant

__all__ = ["MIN_NEW_TOKENS", "SampledTally", "check_sampled_distribution", "pit_of"]

Result = tuple[list[Violation], int, str]
MIN_NEW_TOKENS = 12  # a sampled request's least length: quick's 12 schedules then score well past FIRST
SEED_BASE = 0x42_44_49_53  # "BDIS": the run's n-th sampled generation has seed SEED_BASE + n


@attrs.define
class SampledTally:
    """The run's PIT test across its schedules, and the seeds handed out so far."""

    pit: PitTest
    generations: int = 0

    def next_seed(self) -> int:
        self.generations += 1
        return SEED_BASE + self.generations

    def describe(self) -> str:
        return f"{self.generations} sampled generations in batches; {self.pit.describe()}"


def check_sampled_distribution(inv: Invariant, subject: BatchSubject, schedule: BatchSchedule) -> Result:
    """Run the schedule's requests sampled beside a greedy first row; add their PIT values to the run's test."""
    if subject.make_reference is None:
        return [], 0, "no model to compute p with (`oracle`): the sampled distribution in batches is not judged"
    tally = subject.tally if isinstance(subject.tally, SampledTally) else SampledTally(PitTest("batch", 1e-6))
    calm = schedule.calm()
    longest = max(max(r.max_new_tokens for r in calm.requests), MIN_NEW_TOKENS)
    # the greedy neighbour outlasts every sampled request even accepting whole blocks: a row beside them throughout
    neighbour = attrs.evolve(
        calm.requests[0], arrival=0, seed=None, eos_at=None, max_new_tokens=(subject.k + 1) * (longest + 1)
    )
    sampled = [
        attrs.evolve(
            r, arrival=r.arrival + 1, seed=tally.next_seed(), max_new_tokens=max(r.max_new_tokens, MIN_NEW_TOKENS)
        )
        for r in calm.requests
    ]
    design = BatchSchedule(requests=(neighbour, *sampled))
    params = subject.sampled
    example = {**design.describe(), "sampling": params.describe(), "r0": "greedy, the first row"}
    run = run_schedule(subject, design)
    found = run_failed(inv, run, example)
    if found:
        return found, 1, ""
    before = tally.pit.tested
    for i, spec in enumerate(design.requests[1:], start=1):
        got = run.finished.get(f"r{i}")
        if got is None:
            return [inv.violation(f"sampled r{i} never finished", example=example)], 1, ""
        bad = token_id_problem(got.tokens, subject.vocab_size)
        if bad is not None:
            return [inv.violation(f"sampled r{i}: {bad[2]}", example=example)], 1, ""
        assert spec.seed is not None
        tally.pit.add(pit_of(subject.make_reference(), spec.prompt, list(got.tokens), params, seed=spec.seed))
        if tally.pit.rejected:
            return [_rejection(inv, tally, params, example)], 1, tally.describe()
    exercised = tally.pit.tested - before
    if not tally.pit.tested:
        return [], 0, f"{tally.pit.n} sampled tokens scored, below the PIT's first checkpoint ({FIRST}): nothing tested"
    return [], exercised, tally.describe()


def pit_of(
    model: Any, prompt: Sequence[int], tokens: Sequence[int], params: SamplingParams, *, seed: int
) -> np.ndarray:
    """The PIT values of ``tokens`` after ``prompt`` under ``p``: one teacher-forced forward of a fresh ``model``."""
    if not tokens:
        return np.zeros(0)
    model.reset()
    rows = np.asarray(model.forward([*prompt, *tokens[:-1]]), dtype=np.float64)[len(prompt) - 1 :]
    return pit_values(processed_distribution(rows, params), list(tokens), seed=seed)


def _rejection(inv: Invariant, tally: SampledTally, params: SamplingParams, example: dict[str, object]) -> Violation:
    pit = tally.pit
    return inv.violation(
        f"the tokens of sampled requests in batches are not drawn from p ({params.describe()}): {pit.describe()}; "
        f"{pit.direction()}. The rows' distribution depends on what is batched with them",
        expected=f"Kolmogorov distance <= {pit.threshold:.4f}",
        actual=round(pit.distance, 4),
        example=example,
    )
