#!/usr/bin/env python3
"""How large a slowdown the speed gate sees: planted regressions against a fresh baseline.

    OMP_NUM_THREADS=1 python benchmarks/gate_sensitivity.py [--plain 5] [--levels 0.10,0.15] [--json out.json]

Runs the timed cells of ``specproof bench --quick`` (no drafter comparison, real contexts, batches
or peers: they hold no gated timed figure) once as the baseline, ``--plain`` more times unchanged, then
once per injected regression (``specproof.bench._inject``): a slower proposal and a slower
verify, each by every fraction in ``--levels`` of the baseline's CPU time per round, and an
extra target forward per round. Prints, per run, the gate's verdict, which kinds of figure
regressed, the pooled CPU ratio's change and the load average. docs/bench.md has the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from specproof.bench import BenchConfig, compare, make_baseline, run_bench
from specproof.bench._inject import extra_forward, round_cpu_seconds, slow_proposal, slow_verify


def _config() -> BenchConfig:
    quick = BenchConfig.quick()
    return BenchConfig(
        mode=quick.mode,
        target=quick.target,
        companions=quick.companions,
        drafters=(),
        peers=False,
        real_files=0,
        batch_sizes=(),
    )


def _row(name: str, base: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    report = compare(base, result, gate_cpu=True)  # the CPU-time ratios are what this script measures
    pooled = [f for f in report.findings if f.kind == "cpu_pooled"]
    kinds = sorted({f.kind for f in report.regressions})
    row = {
        "run": name,
        "verdict": "pass" if report.passed else "FAIL",
        "regressed": len(report.regressions),
        "kinds": kinds,
        "pooled_cpu_change": [round(f.change or 0.0, 4) for f in pooled],
        "load": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plain", type=int, default=5, help="unchanged reruns (default 5)")
    parser.add_argument("--levels", default="0.10,0.15", help="injected fractions of a round (default 0.10,0.15)")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    levels = [float(x) for x in args.levels.split(",") if x]
    config = _config()
    first = run_bench(config).to_json()
    base = make_baseline(first)
    per_round = round_cpu_seconds(first)
    print(json.dumps({"baseline_round_cpu_ms": round(per_round * 1e3, 3), "load": os.getloadavg()[0]}), flush=True)
    rows = [_row(f"unchanged {i + 1}", base, run_bench(config).to_json()) for i in range(args.plain)]
    for level in levels:
        delay = level * per_round
        rows.append(
            _row(
                f"proposal +{level:.0%} round", base, run_bench(config, drafter_factory=slow_proposal(delay)).to_json()
            )
        )
        rows.append(
            _row(f"verify +{level:.0%} round", base, run_bench(config, decoder_factory=slow_verify(delay)).to_json())
        )
    rows.append(_row("extra forward per round", base, run_bench(config, decoder_factory=extra_forward).to_json()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"round_cpu_seconds": per_round, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
