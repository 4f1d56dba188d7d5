"""The sampling checks (docs/contract.md, "Sampling"): verdicts over an engine case's sampled search.

Each returns ``(violations, exercised, notes)``: what broke, how much reached the check (tokens
scored, rounds checked, seeds compared; zero makes the check a skip) and what the run could see
(its sensitivity, for the statistical ones). The false-fail bounds of the statistical checks are
``_sequential``'s (Freedman's inequality) and ``_pit``'s (DKW-Massart), at the sample sizes used.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from specproof.conformance.checks import generation as generation_checks
from specproof.contract import Violation
from specproof.contract.lossless import compare_lossless

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._registry import Invariant
    from specproof.conformance._sampled_runs import SampledConfig, SampledRun, SampledSearch
    from specproof.conformance._sequential import EventTest

__all__ = [
    "check_greedy_limit",
    "check_sampled_distribution",
    "check_sampled_rounds",
    "check_sampled_support",
    "check_seeds",
    "distribution_statistics",
]

Checked = tuple[list[Violation], int, list[str]]


def _example(run: SampledRun, **extra: object) -> dict[str, object]:
    gen = run.generation
    return {
        "configuration": run.config,
        "prompt": list(run.prompt),
        "seed": run.seed,
        "max_new_tokens": run.max_new_tokens,
        **({"eos_token_id": run.eos} if run.eos is not None else {}),
        **({"tokens": list(gen.tokens)} if gen is not None else {}),
        **extra,
    }


def _errors(inv: Invariant, search: SampledSearch) -> list[Violation]:
    """A sampled generation that raised, or emitted an id that is not a token, fails every sampling check,
    naming the cause (the first one); ``engine.sampled-support`` gives the bad id's own violation."""
    runs = [run for config in search.configs for run in (*config.runs, *config.chain)]
    failed = next((run for run in runs if run.error is not None or run.bad_token is not None), None)
    if failed is None:
        return []
    if failed.bad_token is not None:
        why = f"{failed.config}: the generation with seed {failed.seed} emitted an id outside the vocabulary"
        return [inv.violation(f"{why} ({failed.bad_token[2]})", example=_example(failed, engine=search.engine))]
    why = f"{failed.config}: the generation with seed {failed.seed} did not complete: {failed.error}"
    return [inv.violation(why, example=_example(failed, engine=search.engine))]


def _bad_tokens(inv: Invariant, search: SampledSearch) -> list[Violation]:
    """The first emitted id that is not a token (an integer in ``[0, vocab)``), with its request."""
    for config in search.configs:
        for run in (*config.runs, *config.chain):
            if run.bad_token is None:
                continue
            index, token, why = run.bad_token
            return [
                inv.violation(
                    f"{config.name}: the engine {search.engine} emitted an id outside the vocabulary on the "
                    f"request with seed {run.seed}: {why}",
                    expected="a token id with p > 0",
                    actual=token,
                    example=_example(run, engine=search.engine, index=index, token=token),
                )
            ]
    return []


def check_sampled_distribution(inv: Invariant, search: SampledSearch, *, tv_target: float) -> Checked:
    """``engine.sampled-distribution``: every event test (Freedman) and the all-token PIT test (DKW-Massart)
    of every configuration stays within its bound. The notes give each configuration's share of the check's
    false-fail bound, sample sizes and sensitivity (the smallest TV each test detects); the check's bound on
    the engine case is in ``distribution_statistics``, the report's."""
    out = _errors(inv, search)
    notes: list[str] = []  # the check's bound and its split: ``distribution_statistics``, in the report
    exercised = 0
    for config in search.configs:
        tokens = sum(len(r.generation.tokens) for r in config.runs if r.generation is not None)
        exercised += tokens
        notes.append(_configuration_note(config, tokens, tv_target))
        if not config.rejected:
            continue
        first, last = config.runs[0], config.runs[-1]
        for test in config.tests.values():
            if not test.rejected:
                continue
            out.append(
                inv.violation(
                    f"{config.name}: the event '{test.summary}' happened {test.hits} times in {test.n} "
                    f"scored tokens, where lossless sampling from p gives {test.expected:.1f} "
                    f"(|S| = {abs(test.total):.1f} >= Freedman threshold {test.threshold:.1f}; a lossless "
                    f"engine fails this with probability <= {test.alpha:.1e}); seeds {first.seed}..{last.seed}",
                    expected=round(test.expected, 2),
                    actual=test.hits,
                    example=_example(last, event=test.name, seeds=[first.seed, last.seed]),
                )
            )
        pit = config.pit
        if pit is not None and pit.rejected:
            out.append(
                inv.violation(
                    f"{config.name}: the randomized PIT of the first {pit.tested} emitted tokens is at "
                    f"Kolmogorov distance {pit.distance:.4f} from uniform, above the DKW-Massart threshold "
                    f"{pit.threshold:.4f} (a lossless engine crosses it with probability <= {pit.alpha:.1e}): "
                    f"{pit.direction()}; seeds {first.seed}..{last.seed}",
                    expected=f"Kolmogorov distance <= {pit.threshold:.4f}",
                    actual=round(pit.distance, 4),
                    example=_example(last, event="pit", seeds=[first.seed, last.seed]),
                )
            )
    return out, exercised, notes


def _configuration_note(config: SampledConfig, tokens: int, tv_target: float) -> str:
    primary = config.primary
    pit = config.pit
    parts = [
        f"{config.name}: {len(config.runs)} seeded generations, {tokens} tokens scored; "
        f"{primary.name.split(': ')[-1]} event on {primary.n} tokens detects a TV deviation of "
        f"{primary.min_detectable:.3f} (target {tv_target:g}) with power 0.99"
    ]
    if pit is not None:
        parts.append(pit.describe())
    tests = len(config.tests) + (pit is not None)
    parts.append(f"this configuration's false-fail bound {config.false_fail_bound:.2g} ({tests} tests)")
    return "; ".join(parts)


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 6)


def statistics_of_tests(events: Mapping[str, Any], pit: Any) -> list[dict[str, object]]:
    """The ``tests`` of a configuration in the report's ``statistics`` (``schemas/report-2.json``): each event
    test (Freedman) and the all-token PIT test (DKW-Massart) where there is one."""
    tests: list[dict[str, object]] = [
        {"test": name, "kind": "event", "alpha": t.alpha, "n": t.n, "rejected": t.rejected}
        for name, t in events.items()
    ]
    if pit is not None:
        tests.append(
            {
                "test": "pit",
                "kind": "pit",
                "alpha": pit.alpha,
                "n": pit.tested,
                "rejected": pit.rejected,
                "kolmogorov_distance": round(pit.distance, 6),
                "threshold": _finite(pit.threshold),
                "detectable": _finite(pit.min_detectable),
            }
        )
    return tests


def distribution_statistics(search: SampledSearch, *, tv_target: float) -> dict[str, object]:
    """The report's ``statistics`` of ``engine.sampled-distribution`` on one engine case: the check's
    false-fail bound (the sum of its configurations') and, per configuration, its share, sample sizes and
    what each test detects (docs/contract.md, "Sampling"; ``schemas/report-2.json``)."""
    configurations = []
    for config in search.configs:
        pit = config.pit
        configurations.append(
            {
                "name": config.name,
                "false_fail_bound": config.false_fail_bound,
                "generations": len(config.runs),
                "tokens": sum(len(r.generation.tokens) for r in config.runs if r.generation is not None),
                "event_tv_detectable": _finite(config.primary.min_detectable),
                "tests": statistics_of_tests(config.tests, pit),
            }
        )
    return {
        "scope": "check",  # the bound is this check's on this engine case, the sum of its configurations'
        "false_fail_bound": sum(c.false_fail_bound for c in search.configs),
        "tv_target": tv_target,
        "power": 0.99,
        "configurations": configurations,
    }


def sensitivity_shortfall(search: SampledSearch, *, tv_target: float) -> str | None:
    """Why the run could not reach the profile's sensitivity (None when every configuration did)."""
    for config in search.configs:
        if config.primary.min_detectable > tv_target and not config.rejected:
            return (
                f"{config.name}: after {len(config.runs)} generations (the profile's budget) the "
                f"{config.primary.name.split(': ')[-1]} event detects only a TV deviation of "
                f"{config.primary.min_detectable:.3f}, not the profile's {tv_target:g}"
            )
    return None


def _support_tolerance(logits_row: np.ndarray, token: int, p_row: np.ndarray, tolerance: float) -> bool:
    """A zero-probability token is excused when its logit is within ``tolerance`` of the weakest kept one
    (an engine whose logits differ by rounding may cut top-k/top-p one token further)."""
    if tolerance <= 0.0:
        return False
    kept = logits_row[p_row > 0.0]
    return bool(kept.size) and float(logits_row[token]) >= float(kept.min()) - 2.0 * tolerance


def check_sampled_support(inv: Invariant, search: SampledSearch, *, tolerance: float) -> Checked:
    """``engine.sampled-support``: every emitted token has probability > 0 under p (top-k, top-p and
    min-p cut nothing an engine may emit), and a round's replacement token differs from the draft
    token it replaced. An emitted id that is not a token at all is this check's violation too."""
    out = _bad_tokens(inv, search) or _errors(inv, search)
    exercised = sum(1 for config in search.configs for run in (*config.runs, *config.chain) if run.bad_token)
    for config in search.configs:
        for run in config.runs:
            gen = run.generation
            if gen is None or run.p is None or run.logits is None:
                continue
            for i, token in enumerate(gen.tokens):
                exercised += 1
                if run.p[i, token] <= 0.0 and not _support_tolerance(run.logits[i], token, run.p[i], tolerance):
                    out.append(
                        inv.violation(
                            f"{config.name}: token {i} = {token} has probability 0 under p "
                            f"({search.params.describe()}): plain sampling never emits it",
                            round=generation_checks.round_of_index(gen.steps or (), i) if gen.steps else None,
                            expected="a token with p > 0",
                            actual=token,
                            example=_example(run, index=i),
                        )
                    )
                    break
            for r, step in enumerate(gen.steps or ()):
                j = len(step.accepted) - 1
                if j < len(step.draft) and step.accepted[j] == step.draft[j]:
                    out.append(
                        inv.violation(
                            f"{config.name}: round {r} replaced the rejected draft token draft[{j}]={step.draft[j]} "
                            f"by the same token: a replacement is drawn from max(0, p - q), which excludes it",
                            round=r,
                            expected=f"a token other than {step.draft[j]}",
                            actual=step.accepted[j],
                            example=_example(run, draft=list(step.draft), accepted=list(step.accepted)),
                        )
                    )
                    break
    return out[:3], exercised, []


def check_sampled_rounds(inv: Invariant, search: SampledSearch, *, k: int | None, rollback: str | None) -> Checked:
    """``engine.sampled-rounds``: the greedy contract's round bounds, KV length, stop rule and costs hold
    on every sampled generation that reports its rounds; the stop rule (nothing after the first EOS, stop
    reason ``eos``) on the generations given an EOS id. The notes say how far the EOS ids and the suite's
    drafts reached."""
    out = _errors(inv, search)
    exercised = 0
    notes: list[str] = []
    for config in search.configs:
        notes.extend(_reach_notes(config))
        for run in config.runs:
            gen = run.generation
            if gen is None or gen.steps is None:
                continue
            exercised += len(gen.steps)
            found: list[Violation] = []
            if k is not None:
                found += generation_checks.check_accept_bounds(inv, gen.steps, k=k)
            found += generation_checks.check_kv_length(inv, gen.steps, prompt_length=len(run.prompt), tokens=gen.tokens)
            found += generation_checks.check_stop(
                inv,
                gen.tokens,
                gen.stop_reason,
                max_new_tokens=run.max_new_tokens,
                eos_token_id=run.eos,
                prompt_length=len(run.prompt),
            )
            if gen.stats is not None:
                found += generation_checks.check_cost(inv, gen, rollback=rollback, prompt_length=len(run.prompt))
            if found:
                out.append(attrs.evolve(found[0], example={**_example(run), **found[0].example}))
                break
    return out[:3], exercised, notes


def _reach_notes(config: SampledConfig) -> list[str]:
    """What a configuration's runs reached: the EOS ids (given, emitted, kept inside a drafted block with more
    of the block after it) and the suite's draft positions (rounds reaching each, of the rounds drafted)."""
    given = [run for run in config.runs if run.eos is not None]
    notes: list[str] = []
    if given:
        stopped = sum(1 for run in given if run.generation is not None and run.eos in run.generation.tokens)
        inside = sum(_eos_inside_block(run) for run in given)
        notes.append(
            f"{config.name}: the stop rule judged on {len(given)} generations given an EOS id; EOS emitted in "
            f"{stopped}, kept inside a drafted block (more of its round after it) in {inside} rounds"
        )
    if config.drafted:
        rounds = config.drafted[0]
        reach = ", ".join(f"{100 * n / rounds:.0f}%" for n in config.reached)
        notes.append(f"{config.name}: of {rounds} suite drafts, the draft positions 0.. were reached in {reach}")
    return notes


def _eos_inside_block(run: SampledRun) -> int:
    """Rounds of ``run`` that kept its EOS id as a draft token (the round goes on after it)."""
    steps = run.generation.steps if run.generation is not None else None
    return sum(1 for step in steps or () if run.eos in step.accepted[:-1])


def seed_collisions(chain: Sequence[SampledRun], *, alpha: float = 1e-6) -> EventTest:
    """The seed-independence test over generations on one prompt with seeds s, s+1, ...: each run is
    compared with the one before on its first ``m`` tokens, ``m`` the shortest prefix whose probability
    under p (read off the earlier run's scores) is at most 0.05 (all its tokens when none is). With
    independent seeds the later run repeats that prefix with exactly that probability."""
    from specproof.conformance._sequential import EventTest as _EventTest

    test = _EventTest(name="collisions", summary="a generation repeats the previous seed's first tokens", alpha=alpha)
    for before, after in itertools.pairwise(chain):
        if before.generation is None or after.generation is None or before.p is None or not before.generation.tokens:
            continue
        tokens = list(before.generation.tokens)
        chance, m = 1.0, 0
        for i, token in enumerate(tokens):
            chance *= float(before.p[i, token])
            m = i + 1
            if chance <= 0.05:
                break
        test.add(list(after.generation.tokens[:m]) == tokens[:m], chance)
    return test


def check_seeds(inv: Invariant, search: SampledSearch) -> Checked:
    """``engine.seeds``: a seed repeated (after other requests) gives the same output, where the engine
    declares ``seeded``; generations with different seeds on the same prompt are not correlated (a run
    repeats the previous seed's opening no more often than independent draws would: ``seed_collisions``)."""
    out = _errors(inv, search)
    exercised = 0
    notes: list[str] = []
    for config in search.configs:
        if config.repeats:
            notes.append(
                f"{config.name}: {len(config.repeats)} seeds asked again after the configuration's other requests"
            )
        for first, again in config.repeats:
            exercised += 1
            a = first.generation.tokens if first.generation is not None else None
            b = again.generation.tokens if again.generation is not None else None
            if a != b:
                out.append(
                    inv.violation(
                        f"{config.name}: seed {first.seed} gave different outputs when asked again after "
                        f"{len(config.runs)} other requests (the engine declares `seeded`): a shared or "
                        "continuing random stream",
                        expected=list(a or ()),
                        actual=list(b or ()) if b is not None else again.error,
                        example=_example(first),
                    )
                )
                break
        test = seed_collisions(config.chain)
        exercised += test.n
        if test.n:
            notes.append(
                f"{config.name}: {test.hits} of {test.n} generations repeated the previous seed's opening "
                f"({test.expected:.1f} expected of independent seeds; threshold {test.threshold:.1f} over "
                f"{test.expected:.1f}, false-fail probability <= {test.alpha:.0e})"
            )
        if test.rejected and test.total > 0:
            out.append(
                inv.violation(
                    f"{config.name}: a generation repeated the previous seed's opening tokens {test.hits} "
                    f"times in {test.n} pairs, where independent draws do {test.expected:.1f} times "
                    f"(Freedman bound, false-fail probability <= {test.alpha:.0e}): the seeds do not "
                    "give independent streams (a broadcast or shared seed)",
                    expected=round(test.expected, 2),
                    actual=test.hits,
                    example={"configuration": config.name},
                )
            )
    if not search.seeded:
        notes.append("the engine does not declare `seeded`: same-seed reproducibility was not required")
    return out, exercised, notes


def check_greedy_limit(
    inv: Invariant,
    search: SampledSearch,
    greedy: Callable[[Sequence[int], int], tuple[list[int], list[float] | None]],
    *,
    tie_tolerance: float,
) -> Checked:
    """``engine.greedy-limit``: at ``temperature=0`` and at ``top_k=1`` the output equals plain greedy
    exactly (ties within the tie tolerance excused)."""
    out: list[Violation] = []
    exercised = 0
    for label, run in search.greedy_runs:
        if run.generation is None:
            out.append(inv.violation(f"{label}: the generation did not complete: {run.error}", example=_example(run)))
            continue
        expected, margins = greedy(list(run.prompt), run.max_new_tokens)
        exercised += 1
        verdict = compare_lossless(
            run.generation.tokens,
            expected,
            expected_margins=margins,
            tie_tolerance=tie_tolerance,
            actual_stop_reason=run.generation.stop_reason,
        )
        breach = verdict.breach()
        if breach is not None:
            breach["explanation"] = f"{label}: {breach['explanation']} (p is one-hot on the argmax: plain greedy)"
            breach["example"] = _example(run, sampling=label)
            out.append(inv.violation(**breach))  # type: ignore[arg-type]
    return out[:2], exercised, []


def _proposal_row_problem(q: np.ndarray, tokens: Sequence[int], vocab_size: int) -> str | None:
    """What is wrong with a declared ``q`` (None: one distribution row per token, each with mass on it)."""
    if q.shape != (len(tokens), vocab_size):
        return f"q has shape {q.shape} for {len(tokens)} tokens, expected ({len(tokens)}, {vocab_size})"
    if not np.isfinite(q).all() or (q < 0).any():
        return "q holds a negative or non-finite entry"
    sums = q.sum(axis=1)
    if len(tokens) and not np.all(np.abs(sums - 1.0) <= 1e-6):
        return f"q rows sum to {np.round(sums, 6).tolist()}, not 1"
    for i, token in enumerate(tokens):
        if q[i, token] <= 0.0:
            return f"token {i} = {token} has q = 0 in the row it was declared to be drawn from"
    return None


def _score_proposal(tests: dict[str, EventTest], tokens: Sequence[int], q: np.ndarray) -> None:
    """Each proposed token on its declared row's top, head (half the mass) and tail (the last tenth) events,
    the same events the engine's tokens are scored on (``_sampled_runs.head_and_tail``)."""
    from specproof.conformance._sampled_runs import head_and_tail

    for i, token in enumerate(tokens):
        row = q[i]
        top = int(np.argmax(row))
        tests["top"].add(token == top, row[top])
        head, tail = head_and_tail(row)
        tests["head"].add(bool(head[token]), float(row[head].sum()))
        tests["tail"].add(bool(tail[token]), float(row[tail].sum()))


def check_proposal_distribution(
    inv: Invariant,
    make_drafter: Callable[[], object],
    *,
    params: object,
    vocab_size: int,
    seed: int,
    longest: int,
    tv_target: float,
    budget: int,
    alpha: float,
) -> Checked:
    """``drafter.proposal-distribution``: ``propose_sampled``'s tokens are drawn from the ``q`` it declares.

    Calls on fixed contexts, each with a generator of its own seed; every proposed token is scored on
    three events of its declared row (``top``: it is the row's top token; ``head``: it is among the top
    tokens holding half the row's mass; ``tail``: among the bottom ones holding a tenth), each a
    Freedman test at ``alpha / 3``, until ``top`` and ``tail`` detect ``tv_target`` or ``budget``
    calls are spent. Wrong rows (not distributions, or
    no mass on the token drawn) fail at once."""
    from specproof.conformance._sampled_runs import sample_prompts
    from specproof.conformance._sequential import EventTest

    drafter = make_drafter()
    propose = getattr(drafter, "propose_sampled", None)
    if not callable(propose):
        return [], 0, ["a deterministic drafter (no propose_sampled): its q is one-hot, nothing to test"]
    tests = {
        "top": EventTest(name="top", summary="the proposed token is its row's top token", alpha=alpha / 3),
        "head": EventTest(name="head", summary="the proposed token is in its row's top half of mass", alpha=alpha / 3),
        "tail": EventTest(
            name="tail", summary="the proposed token is in its row's bottom tenth of mass", alpha=alpha / 3
        ),
    }
    contexts = sample_prompts(vocab_size, longest=max(1, longest), seed=seed)
    for call in range(budget):
        context = contexts[call % len(contexts)]
        example = {"context": context, "k": 4, "rng_seed": [seed, call], "sampling": params.to_json()}  # type: ignore[attr-defined]
        try:
            proposal = propose(list(context), 4, sampling=params, rng=np.random.default_rng([seed, call]))
            tokens = [int(t) for t in proposal.tokens]
            q = np.asarray(proposal.q, dtype=np.float64)
        except Exception as exc:
            why = f"propose_sampled raised {type(exc).__name__}: {exc}"
            return [inv.violation(why, example=example)], call + 1, []
        problem = _proposal_row_problem(q, tokens, vocab_size)
        if problem is not None:
            return [inv.violation(f"call {call}: {problem}", actual=tokens, example=example)], call + 1, []
        _score_proposal(tests, tokens, q)
        rejected = [t for t in tests.values() if t.rejected]
        if rejected:
            t = rejected[0]
            return (
                [
                    inv.violation(
                        f"the event '{t.summary}' happened {t.hits} times in {t.n} proposed tokens, where tokens "
                        f"drawn from the declared q give {t.expected:.1f} (|S| = {abs(t.total):.1f} >= Freedman "
                        f"threshold {t.threshold:.1f}; false-fail probability <= {t.alpha:.1e}): the drafter "
                        "samples from another distribution than the q it declares",
                        expected=round(t.expected, 2),
                        actual=t.hits,
                        example=example,
                    )
                ],
                call + 1,
                [],
            )
        if call >= 8 and max(tests["top"].min_detectable, tests["tail"].min_detectable) <= tv_target:
            break
    notes = [t.describe() for t in tests.values()]
    reached = max(tests["top"].min_detectable, tests["tail"].min_detectable)
    if reached > tv_target:
        notes.insert(0, f"the top and tail events detect only a TV deviation of {reached:.3f}, not {tv_target:g}")
        return [], 0, notes
    return [], tests["top"].n, notes
