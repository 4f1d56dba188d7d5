#!/usr/bin/env python3
"""Power and false fails of the sampling checks (issue 28), over seeded ``certify(sampling=...)`` runs.

    PYTHONPATH=src:/tmp/power-scipy nice python benchmarks/sampling_power.py --runs 50 --profile quick \\
        [--members argmax_verification ... builtin] [--first-seed 1] [--checks ...] [--json out.json]
    ... --timing --runs 5          # CPU time per certify run (built-in stack, sampled and greedy)

``--first-seed F`` runs seeds F..F+N-1, so a long count can be split into chunks (rows add up);
``--checks`` narrows the checks the correct variants are certified on (default: every sampling check).

For each sampling member of the zoo (``ZOO``, the members whose invariant has driver ``sampling``):
the fraction of the ``--runs`` seeded runs (``certify(..., seed=s)`` for s = 1..N, each moving the
generation seeds, so the runs are independent) that reject it on its invariant (``only=(its
invariant,)``), with a 95% Clopper-Pearson interval. For each correct variant (the sampling engines
of ``CORRECT``, the sampling drafter of ``CORRECT_DRAFTERS`` and the built-in stack with the default
n-gram drafter, ``builtin``): the number of runs in which a statistical check (``STATISTICAL``)
failed, and of runs in which any other sampling check failed or errored (both should be 0), with
the interval on the false-fail rate. ``--timing`` reports the median CPU time of one
``certify(sampling=...)`` run of the built-in stack at quick and ci and of the default greedy
``certify()`` at quick, beside the load average. One process, one run at a time: run it under
``nice`` on a shared machine. scipy (``scipy.stats.binomtest``) gives the intervals.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from specproof.conformance import REGISTRY, certify
from specproof.conformance.zoo import CORRECT, CORRECT_DRAFTERS, ZOO

SAMPLING = "temperature=0.8,top_p=0.95"  # the command line
SAMPLING_CHECKS = tuple(inv.id for inv in REGISTRY if inv.driver == "sampling")
STATISTICAL = ("engine.sampled-distribution", "engine.seeds", "drafter.proposal-distribution")
"""The checks that decide on a random sample (Freedman bound 1e-6 each): a false fail is possible only here."""

MEMBERS = tuple(name for name, m in ZOO.items() if m.invariant in SAMPLING_CHECKS)
CORRECT_VARIANTS: dict[str, tuple[str | None, dict[str, str]]] = {
    "builtin": (None, {}),  # the built-in stack, default n-gram drafter, both rollbacks
    **{
        name: ("engine", {"engine": CORRECT[name]})
        for name in ("sampling_engine", "sampling_engine_match_replay", "sampling_engine_own_q")
    },
    "sampling_drafter": ("drafter", {"drafter": CORRECT_DRAFTERS["sampling_drafter"]}),
}
PROFILES = ("quick", "ci", "release")


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval for a binomial proportion ``k / n``."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def _timed(subject: str | None, **options: Any) -> tuple[dict[str, Any], float]:
    """One ``certify(subject, **options)`` run's report and its CPU seconds."""
    start = time.process_time()
    report = certify(subject, **options).to_json()
    return report, time.process_time() - start


def _statuses(report: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in report["results"]:
        out.setdefault(r["invariant"], []).append(r["status"])
    return out


def member_power(name: str, *, runs: int, profile: str, sampling: str, first_seed: int = 1) -> dict[str, Any]:
    """How many of ``runs`` seeded runs reject zoo member ``name`` on its invariant."""
    member = ZOO[name]
    rejected, errors, cpu, missed = 0, 0, [], []
    for seed in range(first_seed, first_seed + runs):
        report, seconds = _timed(
            member.kind,
            **{member.kind: member.spec},
            profile=profile,
            only=(member.invariant,),
            seed=seed,
            sampling=sampling,
        )
        cpu.append(seconds)
        statuses = _statuses(report).get(member.invariant, [])
        rejected += "fail" in statuses
        if "fail" not in statuses:
            missed.append(seed)
        errors += "error" in statuses
    low, high = clopper_pearson(rejected, runs)
    return {
        "member": name,
        "invariant": member.invariant,
        "found_by": member.found_by,
        "profile": profile,
        "runs": runs,
        "seeds": [first_seed, first_seed + runs - 1],
        "rejected": rejected,
        "errors": errors,
        "missed_seeds": missed,  # the runs that did not reject it (``--seed`` reproduces one)
        "power": rejected / runs,
        "ci95": [low, high],
        "cpu_median_s": statistics.median(cpu),
    }


def correct_false_fails(
    name: str, *, runs: int, profile: str, sampling: str, checks: Sequence[str] = SAMPLING_CHECKS, first_seed: int = 1
) -> dict[str, Any]:
    """How many of ``runs`` seeded runs fail correct variant ``name`` on a statistical check, and on any other."""
    subject, options = CORRECT_VARIANTS[name]
    only = tuple(checks)
    false_fails = {c: 0 for c in STATISTICAL if c in only}
    other_failures: dict[str, int] = {}
    failed_runs: list[int] = []
    skipped: set[str] = set()
    cpu: list[float] = []
    status_counts: dict[str, dict[str, int]] = {}
    for seed in range(first_seed, first_seed + runs):
        report, seconds = _timed(subject, **options, profile=profile, only=only, seed=seed, sampling=sampling)
        cpu.append(seconds)
        bad = False
        for invariant, statuses in _statuses(report).items():
            for status in statuses:
                counts = status_counts.setdefault(invariant, {})
                counts[status] = counts.get(status, 0) + 1
            if invariant in false_fails and "fail" in statuses:
                false_fails[invariant] += 1
                bad = True
            elif any(s in ("fail", "error") for s in statuses):
                other_failures[invariant] = other_failures.get(invariant, 0) + 1
                bad = True
            if all(s == "skip" for s in statuses):
                skipped.add(invariant)
        if bad:
            failed_runs.append(seed)
    false_fails = {c: n for c, n in false_fails.items() if c in status_counts}  # the checks this subject has
    low, high = clopper_pearson(len(failed_runs), runs)  # the rate of runs with any failure
    return {
        "variant": name,
        "profile": profile,
        "runs": runs,
        "seeds": [first_seed, first_seed + runs - 1],
        "checks": list(only),
        "false_fails": false_fails,
        "other_failures": other_failures,
        "failed_seeds": failed_runs,
        "always_skipped": sorted(skipped),
        "status_counts": status_counts,  # over every case of every run
        "failure_rate_ci95": [low, high],
        "cpu_median_s": statistics.median(cpu),
    }


def timing(*, runs: int, sampling: str, first_seed: int = 1) -> list[dict[str, Any]]:
    """Median CPU seconds of one certify run of the built-in stack: sampled at quick and ci, greedy at quick."""
    cells: list[tuple[str, str, str | None]] = [
        ("greedy certify()", "quick", None),
        (f"certify(sampling={sampling!r})", "quick", sampling),
        (f"certify(sampling={sampling!r})", "ci", sampling),
    ]
    rows = []
    for label, profile, params in cells:
        cpu, load = [], []
        for seed in range(first_seed, first_seed + runs):
            load.append(_load())
            report, seconds = _timed(None, profile=profile, seed=seed, sampling=params)
            cpu.append(seconds)
            verdict = report["verdict"]
        rows.append(
            {
                "run": label,
                "profile": profile,
                "runs": runs,
                "cpu_median_s": statistics.median(cpu),
                "cpu_s": [round(c, 3) for c in cpu],
                "last_verdict": verdict,
                "load_before_each": load,
            }
        )
        print(f"{label:60s} {profile:6s} median {statistics.median(cpu):7.2f} s CPU  (load {load[-1]})", flush=True)
    return rows


def _interval(ci: Sequence[float]) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="seeded runs per member (seeds 1..N)")
    parser.add_argument("--first-seed", type=int, default=1, help="the first seed (runs use first..first+N-1)")
    parser.add_argument("--profile", default="quick", help=f"one of {', '.join(PROFILES)}")
    parser.add_argument("--members", nargs="*", default=None, help="zoo members and/or correct variants (default: all)")
    parser.add_argument("--sampling", default=SAMPLING, help=f"the sampling parameters (default {SAMPLING})")
    parser.add_argument(
        "--checks",
        nargs="*",
        default=None,
        help="the checks correct variants are certified on (default: every sampling check)",
    )
    parser.add_argument("--timing", action="store_true", help="time the built-in stack instead (--runs per cell)")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    unknown_checks = sorted(set(args.checks or ()) - set(SAMPLING_CHECKS))
    if unknown_checks:
        parser.error(f"unknown checks {unknown_checks}: the sampling checks are {', '.join(SAMPLING_CHECKS)}")
    if args.first_seed < 1:
        parser.error(f"--first-seed must be a positive integer (seed 0 is the derandomized run), not {args.first_seed}")
    if args.runs < 1:
        parser.error(f"--runs must be a positive integer, not {args.runs}")
    if args.profile not in PROFILES:
        parser.error(f"--profile must be one of {', '.join(PROFILES)}, not {args.profile!r}")
    names = list(MEMBERS) + list(CORRECT_VARIANTS) if args.members is None else list(args.members)
    unknown = [n for n in names if n not in MEMBERS and n not in CORRECT_VARIANTS]
    if unknown:
        parser.error(
            f"unknown members {unknown}: sampling zoo members are {', '.join(MEMBERS)}; "
            f"correct variants are {', '.join(CORRECT_VARIANTS)}"
        )
    try:
        clopper_pearson(0, 1)
    except ImportError:
        parser.error("the intervals need scipy: pip install scipy (or put a --target install on PYTHONPATH)")

    out: dict[str, Any] = {"sampling": args.sampling, "profile": args.profile, "load_start": _load()}
    print(f"load {out['load_start']}; {args.runs} seeded runs each, profile {args.profile}, --sampling {args.sampling}")
    if args.timing:
        out["timing"] = timing(runs=args.runs, sampling=args.sampling, first_seed=args.first_seed)
    else:
        out["members"], out["correct"] = [], []
        for name in names:
            if name in MEMBERS:
                row = member_power(
                    name, runs=args.runs, profile=args.profile, sampling=args.sampling, first_seed=args.first_seed
                )
                out["members"].append(row)
                print(
                    f"{name:28s} {row['invariant']:30s} rejected {row['rejected']:4d}/{row['runs']:<4d} "
                    f"power {row['power']:.3f} {_interval(row['ci95'])}  errors {row['errors']}  "
                    f"cpu/run {row['cpu_median_s']:.2f} s  missed seeds {row['missed_seeds'][:8] or '-'}  "
                    f"(load {_load()})",
                    flush=True,
                )
            else:
                row = correct_false_fails(
                    name,
                    runs=args.runs,
                    profile=args.profile,
                    sampling=args.sampling,
                    checks=tuple(args.checks or SAMPLING_CHECKS),
                    first_seed=args.first_seed,
                )
                out["correct"].append(row)
                fails = ", ".join(f"{c} {n}" for c, n in row["false_fails"].items())
                print(
                    f"{name:28s} false fails in {row['runs']} runs: {fails}; other failures "
                    f"{row['other_failures'] or 0}; failing-run rate {_interval(row['failure_rate_ci95'])}; "
                    f"always skipped {row['always_skipped'] or '-'}  cpu/run {row['cpu_median_s']:.2f} s  "
                    f"(load {_load()})",
                    flush=True,
                )
    out["load_end"] = _load()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
