"""The sampled tree check (docs/contract.md, "Sampled trees"): the tree engine's sampled output has plain
sampling's distribution, judged on the search of ``_tree_sampled_runs`` (its event tests and PIT test, each
given a third of the check's false-fail bound)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from specproof.conformance.checks.sampling import statistics_of_tests
from specproof.contract import Violation

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._tree_sampled_runs import TreeSampledSearch

__all__ = ["check_sampled_distribution", "sampled_tree_statistics", "sensitivity_shortfall"]

Checked = tuple[list[Violation], int, list[str]]
INVARIANT = "tree.sampled-distribution"


def _violation(explanation: str, **fields: Any) -> Violation:
    return Violation(invariant=INVARIANT, explanation=explanation, **fields)


def check_sampled_distribution(search: TreeSampledSearch) -> Checked:
    """``tree.sampled-distribution``: no generation failed, and neither event test nor the PIT test rejects.
    Returns the violations, the tokens scored and notes on the sample sizes and sensitivity."""
    out: list[Violation] = []
    failed = next((r for r in search.runs if r.error is not None), None)
    if failed is not None:
        out.append(
            _violation(
                f"the sampled tree generation with seed {failed.seed} did not complete: {failed.error}",
                example={"prompt": list(failed.prompt), "seed": failed.seed, "sampling": search.params.describe()},
            )
        )
    seeds = [r.seed for r in search.runs]
    example = {"sampling": search.params.describe(), "seeds": [min(seeds), max(seeds)] if seeds else []}
    for name, test in search.tests.items():
        if test.rejected:
            out.append(
                _violation(
                    f"the event '{test.summary}' happened {test.hits} times in {test.n} scored positions, where "
                    f"lossless sampling from p gives {test.expected:.1f} (|S| = {abs(test.total):.1f} >= Freedman "
                    f"threshold {test.threshold:.1f}; a lossless engine fails this with probability <= "
                    f"{test.alpha:.1e})",
                    expected=round(test.expected, 2),
                    actual=test.hits,
                    example={**example, "event": name},
                )
            )
    pit = search.pit
    if pit is not None and pit.rejected:
        out.append(
            _violation(
                f"the randomized PIT of the first {pit.tested} emitted tokens is at Kolmogorov distance "
                f"{pit.distance:.4f} from uniform, above the DKW-Massart threshold {pit.threshold:.4f} (a lossless "
                f"engine crosses it with probability <= {pit.alpha:.1e}): {pit.direction()}",
                expected=f"Kolmogorov distance <= {pit.threshold:.4f}",
                actual=round(pit.distance, 4),
                example={**example, "event": "pit"},
            )
        )
    notes = [
        f"{len(search.runs)} seeded sampled tree generations, {search.tokens} tokens scored; false-fail bound "
        f"{search.alpha:.1e} split over {len(search.tests) + 1} tests"
    ]
    notes += [t.describe() for t in search.tests.values()]
    if pit is not None:
        notes.append(pit.describe())
    return out, search.tokens, notes


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 6)


def sampled_tree_statistics(search: TreeSampledSearch, *, tv_target: float) -> dict[str, object]:
    """The report's ``statistics`` (``schemas/report-2.json``) of one search: its false-fail bound and its
    configuration's tests, sizes and sensitivity (the driver joins its configurations)."""
    pit = search.pit
    tests = statistics_of_tests(search.tests, pit)
    least = max((t.min_detectable for t in search.tests.values()), default=math.inf)
    return {
        "scope": "check",
        "false_fail_bound": search.alpha,
        "tv_target": tv_target,
        "power": 0.99,
        "configurations": [
            {
                "name": search.configuration,
                "false_fail_bound": search.alpha,
                "generations": len(search.runs),
                "tokens": search.tokens,
                "event_tv_detectable": _finite(least),
                "tests": tests,
            }
        ],
    }


def sensitivity_shortfall(search: TreeSampledSearch, *, tv_target: float) -> str | None:
    """Why the search could not detect the profile's total-variation drift (None when both events did)."""
    weakest = max(search.tests.values(), key=lambda t: t.min_detectable, default=None)
    if weakest is None or weakest.min_detectable <= tv_target:
        return None
    return (
        f"after {len(search.runs)} sampled tree generations the event '{weakest.name}' on {weakest.n} positions "
        f"detects a drift of {weakest.min_detectable:.3f}, above the profile's {tv_target:g}: inconclusive"
    )
