#!/usr/bin/env python3
"""Power of ``engine.sampled-distribution`` on deviations of a controlled total variation, per profile,
and its false-fail rate on correct engines (docs/contract.md, "Sampling": the power table).

    PYTHONPATH=src nice python benchmarks/sampling_deviation_power.py --profiles quick ci --runs 30 10 \\
        [--deltas 0.02 0.03 0.04 0.05] [--shapes sharper flatter] [--correct-runs 30 8] [--jobs 4] \\
        [--jsonl rows.jsonl]

Each cell is ``--runs`` seeded sampled searches (``--seed`` s = 1..N, each moving the generation seeds,
so the runs are independent) of a ``TvDeviation`` engine (``zoo/_sampling_deviations``: it samples
exactly from ``p'`` with ``TV(p', p) = min(delta, room)`` at every position, mass moved onto the top
token, ``sharper``, or off it, ``flatter``) at ``--sampling``, judged by ``check_sampled_distribution``
as ``certify --only engine.sampled-distribution`` judges it. A cell gives the fraction rejected (with
a 95% Clopper-Pearson interval from scipy), which tests rejected (the event tests or the all-token
PIT test), and the mean realized TV per emitted token (positions where ``p`` is one-hot leave no
room). The correct engines (the zoo's rejection sampler and the Gumbel-max one) give the false-fail
rate. ``--jobs`` runs cells' seeds in parallel processes; rows are printed (and appended to
``--jsonl``) as they finish, then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

SAMPLING = "temperature=0.8,top_p=0.95"
DEVIATIONS = "specproof.conformance.zoo._sampling_deviations"
CORRECT = {
    "sampling_engine": "specproof.conformance.zoo:sampling_engine",
    "gumbel_engine": f"{DEVIATIONS}:gumbel_engine",
}


def one_run(spec: str, profile: str, seed: int, sampling: str, delta: float, shape: str | None) -> dict[str, Any]:
    """One seeded sampled search of ``spec`` at ``profile``: whether the check rejects it, and by which tests."""
    import numpy as np

    from specproof.conformance._plan import Plan
    from specproof.conformance._registry import REGISTRY
    from specproof.conformance._sampled_runs import run_sampled_search
    from specproof.conformance.checks.sampling import check_sampled_distribution

    start = time.process_time()
    plan = Plan.create(subject="engine", engine=spec, sampling=sampling, profile=profile, seed=seed)
    assert plan.sampling is not None
    search = run_sampled_search(
        plan.suite.engines[0],
        target=plan.suite.target,
        drafter_subject=plan.suite.drafter,
        params=plan.sampling,
        profile=plan.profile,
        seed=seed,
        alpha=1e-6,
    )
    inv = next(i for i in REGISTRY if i.id == "engine.sampled-distribution")
    violations, exercised, _ = check_sampled_distribution(inv, search, tv_target=plan.profile.sampling_tv)
    realized, tokens = [], 0
    for config in search.configs:
        for run in config.runs:
            if run.p is None:
                continue
            top = run.p.max(axis=1)
            room = np.where(top >= 1.0, 0.0, 1.0 - top if shape == "sharper" else top)
            realized.append(np.minimum(delta, room))
            tokens += len(top)
    return {
        "rejected": bool(violations),
        "by_events": any(t.rejected for c in search.configs for t in c.tests.values()),
        "by_pit": any(c.pit is not None and c.pit.rejected for c in search.configs),
        "generations": sum(len(c.runs) for c in search.configs),
        "tokens": tokens,
        "realized_tv": float(np.concatenate(realized).mean()) if realized and shape else 0.0,
        "cpu_s": time.process_time() - start,
        "exercised": exercised,
    }


def oracle_rows(sampling: str) -> Any:
    """The oracle's processed rows ``p`` of every token a correct engine emits at quick (seed 0): the pool
    the simulation draws positions from."""
    import numpy as np

    from specproof.conformance._plan import Plan
    from specproof.conformance._sampled_runs import run_sampled_search

    plan = Plan.create(subject="engine", engine=CORRECT["sampling_engine"], sampling=sampling)
    assert plan.sampling is not None
    search = run_sampled_search(
        plan.suite.engines[0],
        target=plan.suite.target,
        drafter_subject=None,
        params=plan.sampling,
        profile=plan.profile,
        seed=0,
        alpha=1e-6,
    )
    return np.concatenate([r.p for c in search.configs for r in c.runs if r.p is not None])


def simulated_run(
    pool: Any, profile: str, delta: float, shape: str | None, seed: int, *, old_rule: bool = False
) -> dict[str, Any]:
    """One simulated run of the check at ``profile`` on an engine that samples from ``deviate(p)`` (``p`` if
    ``shape`` is None): two configurations (a plug-in engine's), each the profile's budget of generations of
    ``max_new_tokens`` positions drawn from ``pool``, judged by the check's own thresholds (the top, head
    and tail events' Freedman test, looked at after every generation, and ``PitTest``); no draft events.
    ``old_rule``: the check before issue 35 (events only, each configuration stopped once its top event
    detected the profile's TV, at least 8 generations in)."""
    import numpy as np

    from specproof.conformance._pit import PitTest, pit_values
    from specproof.conformance._profiles import get_profile
    from specproof.conformance._sampled_runs import TESTS_PER_CONFIGURATION, head_and_tail
    from specproof.conformance._sequential import POWER_Z, freedman_threshold
    from specproof.conformance.zoo._sampling_deviations import deviate

    prof = get_profile(profile)
    alpha = 1e-6 / (2 * (TESTS_PER_CONFIGURATION - 1 if old_rule else TESTS_PER_CONFIGURATION))
    tops = pool.argmax(axis=1)
    masks = [np.eye(pool.shape[1], dtype=bool)[tops], *(np.stack(m) for m in zip(*map(head_and_tail, pool)))]
    emitted = pool if shape is None else np.stack([deviate(row, delta, shape) for row in pool])
    rng = np.random.default_rng([seed, 35])
    out = {"rejected": False, "by_events": False, "by_pit": False, "tokens": 0}
    for _config in range(2):
        n, length = prof.sampling_generations * prof.max_new_tokens, prof.max_new_tokens
        rows = rng.integers(0, len(pool), size=n)
        tokens = (rng.random((n, 1)) > np.cumsum(emitted[rows], axis=1)).sum(axis=1)
        tokens = np.minimum(tokens, pool.shape[1] - 1)
        ends = np.arange(length, n + 1, length)
        if old_rule:  # where the top event first detected the profile's TV: the former stopping point
            pi = (pool[rows] * masks[0][rows]).sum(axis=1)
            variance = np.cumsum(pi * (1 - pi))[ends - 1]
            sized = [(freedman_threshold(v, alpha) + POWER_Z * np.sqrt(v)) / e for v, e in zip(variance, ends)]
            stop = next((g for g, d in enumerate(sized) if g >= 7 and d <= prof.sampling_tv), len(ends) - 1)
            ends = ends[: stop + 1]
        out["tokens"] += int(ends[-1])
        for mask in masks:
            pi = (pool[rows] * mask[rows]).sum(axis=1)
            total = np.cumsum(mask[rows, tokens] - pi)[ends - 1]
            variance = np.cumsum(pi * (1 - pi))[ends - 1]
            if any(abs(s) >= freedman_threshold(v, alpha) for s, v in zip(total, variance, strict=True)):
                out["by_events"] = True
        pit = PitTest(name="sim", alpha=alpha)
        for g, end in enumerate([] if old_rule else ends):
            pit.add(pit_values(pool[rows[end - length : end]], tokens[end - length : end], seed=seed * 100003 + g))
        out["by_pit"] = out["by_pit"] or pit.rejected
    out["rejected"] = out["by_events"] or out["by_pit"]
    return out


def simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from specproof.conformance._profiles import get_profile

    pool = oracle_rows(args.sampling)
    top = pool.max(axis=1)
    print(f"pool: {len(pool)} oracle rows; {np.mean(top >= 1.0):.0%} one-hot", flush=True)
    rows = []
    for profile, runs in zip(args.profiles, args.runs + [args.runs[-1]] * len(args.profiles), strict=False):
        cells: list[tuple[str, float, str | None]] = [("correct (from p)", 0.0, None)]
        cells += [(f"{shape} {d:g}", d, shape) for shape in args.shapes for d in args.deltas]
        for label, delta, shape in cells:
            done = [
                simulated_run(pool, profile, delta, shape, seed, old_rule=args.old_rule) for seed in range(1, runs + 1)
            ]
            room = np.where(top >= 1.0, 0.0, 1.0 - top if shape == "sharper" else top)
            k = sum(r["rejected"] for r in done)
            low, high = clopper_pearson(k, runs)
            row = {
                "profile": profile,
                "rule": "before issue 35" if args.old_rule else "current",
                "engine": label,
                "runs": runs,
                "rejected": k,
                "ci95": [round(low, 3), round(high, 3)],
                "by_events": sum(r["by_events"] for r in done),
                "by_pit": sum(r["by_pit"] for r in done),
                "realized_tv": round(float(np.minimum(delta, room).mean()), 4) if shape else 0.0,
                "generations_median": 2 * get_profile(profile).sampling_generations,
                "tokens_median": done[0]["tokens"],
                "cpu_median_s": 0.0,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.jsonl:
                with open(args.jsonl, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"simulated": True, **row}) + "\n")
    print()
    print(table(rows))
    return 0


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["quick"], choices=["quick", "ci", "release"])
    parser.add_argument("--runs", nargs="+", type=int, default=[30], help="seeded runs per deviation, per profile")
    parser.add_argument("--correct-runs", nargs="+", type=int, default=None, help="per profile (default --runs)")
    parser.add_argument("--deltas", nargs="+", type=float, default=[0.02, 0.03, 0.04, 0.05])
    parser.add_argument("--shapes", nargs="+", default=["sharper", "flatter"], choices=["sharper", "flatter"])
    parser.add_argument("--correct", nargs="*", default=list(CORRECT), choices=list(CORRECT))
    parser.add_argument("--sampling", default=SAMPLING)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--jsonl", default=None, help="append each finished cell's row to this file")
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="simulate the check's tests on the oracle's rows instead of running the engines (seconds a cell)",
    )
    parser.add_argument(
        "--old-rule", action="store_true", help="with --simulate: the check before issue 35, for comparison"
    )
    args = parser.parse_args(argv)
    runs = dict(zip(args.profiles, args.runs + [args.runs[-1]] * len(args.profiles), strict=False))
    correct_runs = dict(
        zip(args.profiles, (args.correct_runs or args.runs) + [args.runs[-1]] * len(args.profiles), strict=False)
    )
    for delta in args.deltas:
        if not 0.0 < delta < 1.0 or round(delta * 100) != delta * 100:
            parser.error(f"--deltas: {delta} must be a multiple of 0.01 in (0, 1)")
    if args.simulate:
        return simulate(args)
    cells: list[tuple[str, str, str, float, str | None]] = []  # (profile, label, spec, delta, shape)
    for profile in args.profiles:
        for name in args.correct:
            cells.append((profile, name, CORRECT[name], 0.0, None))
        for shape in args.shapes:
            for delta in args.deltas:
                spec = f"{DEVIATIONS}:{shape}_{round(delta * 100):03d}"
                cells.append((profile, f"{shape} {delta:g}", spec, delta, shape))
    load = os.getloadavg()
    print(f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; --sampling {args.sampling}; jobs {args.jobs}", flush=True)
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {}
        for profile, label, spec, delta, shape in cells:
            n = correct_runs[profile] if shape is None else runs[profile]
            for seed in range(1, n + 1):
                future = pool.submit(one_run, spec, profile, seed, args.sampling, delta, shape)
                futures[future] = (profile, label, n)
        for future in as_completed(futures):
            profile, label, n = futures[future]
            done = rows.setdefault((profile, label), [])
            done.append(future.result())
            if len(done) == n:
                row = summarize(profile, label, done)
                print(json.dumps(row), flush=True)
                if args.jsonl:
                    with open(args.jsonl, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(row) + "\n")
    print()
    print(table([summarize(p, label, rows[(p, label)]) for p, label, *_ in cells if (p, label) in rows]))
    load = os.getloadavg()
    print(f"\nload at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


def summarize(profile: str, label: str, done: list[dict[str, Any]]) -> dict[str, Any]:
    n, k = len(done), sum(r["rejected"] for r in done)
    low, high = clopper_pearson(k, n)
    return {
        "profile": profile,
        "engine": label,
        "runs": n,
        "rejected": k,
        "ci95": [round(low, 3), round(high, 3)],
        "by_events": sum(r["by_events"] for r in done),
        "by_pit": sum(r["by_pit"] for r in done),
        "realized_tv": round(sum(r["realized_tv"] for r in done) / n, 4),
        "generations_median": sorted(r["generations"] for r in done)[n // 2],
        "tokens_median": sorted(r["tokens"] for r in done)[n // 2],
        "cpu_median_s": round(sorted(r["cpu_s"] for r in done)[n // 2], 2),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| profile | engine (TV moved) | mean realized TV | rejected | 95% interval | by events / by PIT | "
        "generations, tokens (median) | CPU s/run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['profile']} | {r['engine']} | {r['realized_tv']:.3f} | {r['rejected']}/{r['runs']} | "
            f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] | {r['by_events']} / {r['by_pit']} | "
            f"{r['generations_median']}, {r['tokens_median']} | {r['cpu_median_s']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
