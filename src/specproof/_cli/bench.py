"""``specproof bench``: the benchmark table, JSON, plot, and the speed gate; with ``--drafter SPEC``,
one drafter's acceptance and the acceptance gate (docs/benchmarks-guide.md).

Exit codes: 0 (measured; gate passed if asked), 1 (the gate found a regression, a peer engine that
is installed failed to run, or a batch was not lossless), 2 (a usage error, e.g. a bad baseline file:
the message names the field; ``--plot`` without matplotlib; a baseline that cannot gate this run).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from specproof.bench import DEFAULT_TARGET

    p = sub.add_parser(
        "bench",
        help="benchmark speculative vs plain greedy decoding; gate speed regressions against a baseline",
        description=(
            "Measure tokens per round, acceptance by position, target forwards per token, verify-cost ratio, "
            "interleaved wall-clock speedup and efficiency, projected bandwidth-bound speedup (MoE-aware), drafter "
            "cost at 1K/8K/64K context and certify wall time, on four workloads built from the standard library; "
            "each drafter's acceptance on held-out real text, greedy and sampled at T = 0.7 and 1.0 (rejection "
            "sampling, fixed seeds); the batched reference decoder at batch 1, 4 and 16 beside the single-request "
            "engine (tokens per round, verify forwards per token, tokens/s). "
            "--gate fails (exit 1) when a machine-independent figure (a count: tokens per round, forwards per "
            "token, acceptance) regresses beyond its threshold; the timed ratios are reported, and gated only on "
            "request: CPU-time ratios with --gate-cpu, wall-clock ratios with --gate-wall; absolute seconds are "
            "never gated. "
            "--drafter SPEC measures that drafter's acceptance instead (greedy counts by draft position on the "
            "real contexts and the four workloads): --save-baseline from one drafter, --gate another or a later "
            "version against it."
        ),
    )
    p.add_argument("--quick", action="store_true", help="the CI preset: k=4, short runs (under a minute here)")
    p.add_argument(
        "--target",
        default=None,
        metavar="SPEC",
        help=f"target spec (default {DEFAULT_TARGET}; with a feature --drafter, the target it reads)",
    )
    p.add_argument(
        "--drafter",
        default=None,
        metavar="SPEC",
        help="measure this drafter's acceptance only (the specs certify/generate take: ngram, model:T, eagle:trained, "
        "mtp:trained, MODULE:ATTR, ...); --save-baseline and --gate then gate its acceptance, not speed",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="write the full result as JSON")
    p.add_argument("--plot", default=None, metavar="FILE", help="write a PNG of speedup vs k per workload")
    p.add_argument("--gate", default=None, metavar="BASELINE", help="compare with this baseline; exit 1 on regression")
    p.add_argument(
        "--gate-cpu",
        action="store_true",
        help="with --gate, also fail on the CPU-time ratios (cpu speedup per cell and pooled per target): for a "
        "quiet machine; by default they are reported, since CPU-bound jobs beside the run move them too",
    )
    p.add_argument(
        "--gate-wall",
        action="store_true",
        help="with --gate, also fail on the wall-clock ratios (speedup, efficiency, drafter scaling): for a quiet "
        "machine; by default they are reported, since another job's load moves them",
    )
    p.add_argument("--save-baseline", default=None, metavar="BASELINE", help="write this run as the new baseline")
    p.add_argument(
        "--trees",
        action="store_true",
        help="also measure token trees beside chains (2x2x2, 4-2-1, dynamic:16 for the EAGLE head and the draft "
        "model): tokens per round on the real contexts and CPU speedup decoding (docs/bench.md, Trees); "
        "reported, not gated",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from specproof.bench import (
        DEFAULT_TARGET,
        BenchConfig,
        check_acceptance_baseline,
        compare,
        load_baseline,
        plot_result,
        run_bench,
        save_baseline,
    )
    from specproof.bench.cli_support import plan_size
    from specproof.contract.files import check_output_path
    from specproof.formats import bench as bench_format

    # every usage problem before minutes of measuring: output paths first (nothing is created)
    for option, path in (("--json", args.json), ("--plot", args.plot), ("--save-baseline", args.save_baseline)):
        if path:
            check_output_path(path, option=option)
    _check_gate_options(args)
    if args.drafter is not None:
        return _run_drafter(args)
    args.target = DEFAULT_TARGET if args.target is None else args.target
    if args.plot:
        _require_matplotlib()
    baseline = load_baseline(args.gate) if args.gate else None
    config = BenchConfig.quick(target=args.target) if args.quick else BenchConfig.full(target=args.target)
    if args.trees:
        import attrs

        config = attrs.evolve(config, trees=True)
    if baseline is not None:
        check_acceptance_baseline(baseline, where=args.gate, drafter=None, target=config.target, mode=config.mode)
        for field, value in (("mode", config.mode), ("target", config.target)):
            if baseline[field] != value:
                from specproof.bench import BaselineError

                raise BaselineError(
                    f"baseline {args.gate}: field {field!r} is {baseline[field]!r} but this run has {field}={value!r}"
                )
    from specproof.plugins import load_target

    for spec in config.targets:  # a bad --target is a usage error now, not after the first workload
        load_target(spec)

    # a table of 16 columns: wider than 80 when the output is a file or a pipe
    console = Console(width=max(Console().width, 200))
    with _progress(console, plan_size(config)) as tick:
        result = run_bench(config, progress=tick)
    data = result.to_json()
    _print_tables(console, data)
    if args.json:
        bench_format.FORMAT.write(args.json, data)
    if args.plot:
        plot_result(data, args.plot)
        console.print(f"plot written to {args.plot}")
    if args.save_baseline:
        save_baseline(args.save_baseline, data)
        console.print(f"baseline written to {args.save_baseline}")
    failed_peers = _print_peer_errors(data) + _print_lossy_batches(data) + _print_lossy_trees(data)
    if baseline is None:
        return 1 if failed_peers else 0
    report = compare(baseline, data, gate_wall=args.gate_wall, gate_cpu=args.gate_cpu)
    gate = _print_gate(console, report, args.gate)
    return 1 if failed_peers else gate


def _check_gate_options(args: argparse.Namespace) -> None:
    """The options that go only with others, in one place (a usage error before any measuring)."""
    from specproof.contract.errors import InvalidSettingError

    timed = (("--gate-cpu", args.gate_cpu, "CPU-time"), ("--gate-wall", args.gate_wall, "wall-clock"))
    if args.drafter is not None:
        for flag, given, why in (
            *((flag, given, f"it gates {clock} figures") for flag, given, clock in timed),
            ("--plot", args.plot, "it draws speedup"),
            ("--trees", args.trees, "it measures the trees of the bench's own tree drafters"),
        ):
            if given:
                raise InvalidSettingError(
                    f"{flag} does not go with --drafter: {why}, and a --drafter run measures acceptance only"
                )
    for flag, given, _ in timed:
        if given and not args.gate:
            raise InvalidSettingError(f"{flag} gates against a baseline: give --gate BASELINE too")


def _run_drafter(args: argparse.Namespace) -> int:
    """``bench --drafter SPEC``: the drafter's acceptance counts; ``--save-baseline`` / ``--gate`` on them."""
    from rich.console import Console

    from specproof.bench import (
        BenchConfig,
        check_acceptance_baseline,
        compare,
        load_baseline,
        resolve_drafter_target,
        run_drafter_bench,
        save_baseline,
    )
    from specproof.bench.cli_support import acceptance_k, acceptance_lines, drafter_plan_size
    from specproof.formats import bench as bench_format

    # a bad baseline, drafter spec or target before any measuring
    baseline = load_baseline(args.gate) if args.gate else None
    target, factory = resolve_drafter_target(args.drafter, args.target)
    config = BenchConfig.quick(target=target) if args.quick else BenchConfig.full(target=target)
    if baseline is not None:
        check_acceptance_baseline(
            baseline, where=args.gate, drafter=args.drafter, target=target, mode=config.mode, k=acceptance_k(config.ks)
        )
    # in a log (not a terminal) a figure line is never wrapped: CI logs are read and grepped line by line
    console = Console(width=max(Console().width, 160), soft_wrap=not sys.stdout.isatty())
    with _progress(console, drafter_plan_size(config)) as tick:
        data = run_drafter_bench(config, args.drafter, factory, progress=tick)
    for line in acceptance_lines(data["acceptance"]):
        console.print(line, markup=False, highlight=False)
    if args.json:
        bench_format.FORMAT.write(args.json, data)
    if args.save_baseline:
        save_baseline(args.save_baseline, data)
        console.print(
            f"baseline written to {args.save_baseline} (drafter {args.drafter}, target {target})", markup=False
        )
    lossy = [e["workload"] for e in data["acceptance"]["workloads"] if e.get("lossless") is False]
    if lossy:  # acceptance of a drafter the engine decoded wrongly with is no figure at all
        print(f"specproof bench: error: the output was not lossless on {', '.join(lossy)}", file=sys.stderr)
    if baseline is None:
        return 1 if lossy else 0
    if baseline["drafter"] != args.drafter:
        console.print(
            f"gating --drafter {args.drafter} against the baseline of --drafter {baseline['drafter']} "
            f"({args.gate}): a different drafter spec, compared on the same target ({target})",
            markup=False,
        )
    report = compare(baseline, data)
    return max(_print_acceptance_gate(console, report, args.gate, baseline, data), 1 if lossy else 0)


def _print_acceptance_gate(console: Any, report: Any, path: str, baseline: Any, data: Any) -> int:
    from specproof.bench.cli_support import finding_line

    threshold = baseline["thresholds"]["acceptance"]
    if report.passed:
        same = all(f.change == 0 for f in report.findings)
        console.print(
            f"[green]acceptance gate passed[/]: {len(report.findings)} figures of {path} within {threshold:.1%}"
            + (" (every count identical)" if same else ""),
        )
        return 0
    console.print(
        f"[bold red]acceptance gate failed[/] against {path}: {len(report.regressions)} of "
        f"{len(report.findings)} figure(s) fell by more than {threshold:.1%}"
    )
    order = {str(e["workload"]): i for i, e in enumerate(baseline["acceptance"]["workloads"])}

    def where(f: Any) -> tuple[int, str]:  # the baseline's workload order, then the key (positions, tokens/round)
        return order.get(f.key.split("/")[1], len(order)), f.key

    for f in sorted(report.regressions, key=where):
        line = finding_line(
            f.key,
            f.baseline,
            f.now,
            f.change,
            f.threshold,
            baseline=baseline.get("acceptance"),
            run=data.get("acceptance"),
        )
        console.print("  " + line, markup=False, highlight=False)
    return 1


def _progress(console: Any, total: int) -> Any:
    """A transient progress bar; the context gives the tick to pass as ``progress``."""
    import contextlib

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextlib.contextmanager
    def bar() -> Any:
        with Progress(
            TextColumn("[bold]bench[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("starting", total=total)
            yield lambda message: progress.update(task, advance=1, description=message)

    return bar()


def _require_matplotlib() -> None:
    """``--plot`` needs matplotlib (the ``[bench]`` extra): a usage error before minutes of measuring."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        from specproof.contract.errors import InvalidSettingError

        raise InvalidSettingError(
            "--plot needs matplotlib: install specproof[bench] (pip install 'specproof[bench]'), or drop --plot"
        ) from None


def _print_peer_errors(data: dict[str, Any]) -> int:
    """A peer engine that is installed but failed to run fails the bench: one line each on stderr."""
    failed = [p for p in data.get("peers", ()) if p.get("status") == "error"]
    for peer in failed:
        print(
            f"specproof bench: error: peer {peer.get('peer')} ({peer.get('target')}) failed: {peer.get('reason')}",
            file=sys.stderr,
        )
    return len(failed)


def _print_lossy_trees(data: dict[str, Any]) -> int:
    """A tree decoding whose tokens differ from plain greedy's fails the bench: one line each on stderr."""
    cells = ((data.get("trees") or {}).get("decoding") or {}).get("cells", ())
    lossy = [c for c in cells if not c.get("lossless", True)]
    for cell in lossy:
        print(
            f"specproof bench: error: decoding with {cell['drafter']} at {cell['shape']} was not lossless",
            file=sys.stderr,
        )
    return len(lossy)


def _print_lossy_batches(data: dict[str, Any]) -> int:
    """A batch whose requests' tokens differ from their solo runs fails the bench: one line each on stderr."""
    lossy = [c for c in (data.get("batches") or {}).get("cells", ()) if not c.get("lossless", True)]
    for cell in lossy:
        print(
            f"specproof bench: error: the batch of {cell['batch']} was not lossless: a request's tokens differ "
            "from its solo run's",
            file=sys.stderr,
        )
    return len(lossy)


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _print_tables(console: Any, data: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from specproof.bench.cli_support import degeneracy_label

    plat = data["platform"]
    table = Table(
        title=(
            f"specproof bench ({data['config']['mode']}) — {plat['cpus']} CPUs, Python {plat['python']}, "
            f"numpy {plat['numpy']}; free-running decoding; speedup: median of {data['config']['chunks']} interleaved "
            "chunk pairs (wall / CPU time)"
        )
    )
    cols = [
        ("workload", "left"),
        ("target", "left"),
        ("rollback", "left"),
        ("k", "right"),
        ("tok/round", "right"),
        ("accepted by position", "left"),
        ("fwd/token", "right"),
        ("replay/round", "right"),
        ("verify cost", "right"),
        ("speedup", "right"),
        ("cpu speedup", "right"),
        ("efficiency", "right"),
        ("projected", "right"),
        ("verify bytes", "right"),
        ("lossless", "left"),
        ("continuation (4-gram share, period)", "left"),
    ]
    for name, justify in cols:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in data["cells"]:
        table.add_row(
            c["workload"],
            c["target"],
            c["rollback"],
            str(c["k"]),
            _fmt(c["tokens_per_round"]),
            " ".join(f"{a:.2f}" for a in c["acceptance_by_position"]) or "-",
            _fmt(c["forwards_per_token"]),
            _fmt(c["replay_per_round"]),
            f"{c['verify_cost_ratio']:.2f}x",
            f"{c['speedup']:.2f}x",
            f"{c['cpu_speedup']:.2f}x" if "cpu_speedup" in c else "-",
            _fmt(c["efficiency"]),
            f"{c['projected_speedup']:.2f}x",
            f"{c['verify_bytes_ratio']:.2f}x",
            "yes" if c["lossless"] else "[bold red]NO[/]",
            degeneracy_label(c),
        )
    console.print(table)
    d = data["drafter"]
    secs = d["seconds"]
    console.print(
        "drafter proposal (median, after appending "
        f"{d['append']} tokens): "
        + ", ".join(f"{int(n) // 1024}K {s * 1e6:.2f} us" for n, s in secs.items())
        + f"; {d['scaling_contexts'][1] // 1024}K / {d['scaling_contexts'][0] // 1024}K = {d['scaling']:.2f}x"
    )
    cert = data["certify"]
    if "seconds" in cert:
        console.print(f"specproof certify --profile ci: {cert['seconds']:.1f} s wall ({cert['status']})")
    else:
        console.print(escape(f"specproof certify --profile ci: not measured ({cert.get('reason')})"))
    from specproof.bench.cli_support import (
        batch_lines,
        drafter_table_lines,
        peer_lines,
        real_context_lines,
        tree_lines,
    )

    lines = [*drafter_table_lines(data), *real_context_lines(data), *batch_lines(data), *tree_lines(data)]
    for line in [*lines, *peer_lines(data)]:
        console.print(line, markup=False, highlight=False)
    console.print(f"bench wall time {data['seconds']:.1f} s")


def _print_gate(console: Any, report: Any, path: str) -> int:
    from rich.table import Table

    from specproof.bench.cli_support import CPU_KINDS

    for f in report.timing_drops:  # reported, not gated (--gate-cpu, --gate-wall gate them)
        clock, flag = ("CPU-time", "--gate-cpu") if f.kind in CPU_KINDS else ("wall-clock", "--gate-wall")
        console.print(
            f"note: {clock} {f.key} {f.baseline:.3f} -> {f.now:.3f} ({f.change:+.1%}, threshold "
            f"{f.threshold:.0%}): reported, not gated (use {flag} on a quiet machine)",
            markup=False,
        )
    if report.passed:
        gated = sum(f.status != "reported" for f in report.findings)
        console.print(
            f"[green]gate passed[/]: {gated} figures within threshold of {path} "
            f"({len(report.findings) - gated} timed figures reported, not gated)"
        )
        return 0
    table = Table(title=f"[bold red]gate failed[/] against {path}: {len(report.regressions)} figure(s) regressed")
    for col in ("figure", "kind", "better", "baseline", "now", "change", "threshold"):
        table.add_column(col, justify="left" if col in ("figure", "kind", "better") else "right")
    for f in report.regressions:
        table.add_row(
            f.key,
            f.kind,
            f.better,
            _fmt(f.baseline, 3),
            "missing" if f.now is None else _fmt(f.now, 3),
            "-" if f.change is None else f"{f.change:+.1%}",
            f"{f.threshold:.1%}",
        )
    console.print(table)
    return 1
