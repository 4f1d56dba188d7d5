"""``specproof check-trace``: check a trace file's invariants, and losslessness against an oracle."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from specproof.formats import golden as golden_format
from specproof.formats import trace as trace_format


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "check-trace",
        help=f"check a {trace_format.ID} file (round invariants, and losslessness against an oracle)",
        description=(
            f"Check the invariants of a {trace_format.ID} file: accept bounds and rule, KV length, stopping, "
            "trace consistency, and engine.lossless against golden greedy tokens or a target. "
            "Exit status: 0 everything passed (an excused near-tie counts as a pass), 1 an invariant failed, "
            "2 a malformed trace, a bad command line, or an oracle that cannot decide."
        ),
    )
    p.add_argument("file", metavar="FILE", help=f"the trace (JSON Lines, {trace_format.ID})")
    oracle = p.add_mutually_exclusive_group()
    oracle.add_argument(
        "--greedy",
        default=None,
        metavar="GOLDEN.json",
        help=f"a {golden_format.ID} file: its case for the trace's prompt is plain greedy's output",
    )
    oracle.add_argument(
        "--target",
        nargs="?",
        const="",
        default=None,
        metavar="SPEC",
        help="run plain greedy on this target spec (without SPEC: the target named in the trace header)",
    )
    p.add_argument(
        "--tie-tolerance",
        type=_tolerance,
        default=0.0,
        metavar="T",
        help="excuse a divergence whose top-2 logit margin is below T (default 0: exact)",
    )
    p.add_argument(
        "--router-margin",
        type=_tolerance,
        default=0.0,
        metavar="M",
        help="with --target: also excuse a divergence after a row whose router margin on the target is below M "
        "(a lower-precision engine may route it otherwise; default 0: exact routing)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.set_defaults(func=run)


_STYLE = {"pass": "green", "excused": "yellow", "skipped": "dim", "inconclusive": "magenta", "fail": "bold red"}


def run(args: argparse.Namespace) -> int:
    import attrs
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from specproof._cli.common import make_target
    from specproof.conformance import get
    from specproof.conformance.traces import check_trace, load_golden, read_trace
    from specproof.contract import UsageError

    if args.router_margin and args.target is None:
        raise UsageError("--router-margin needs --target: it reads the target's router margins")
    trace = read_trace(args.file)
    if args.greedy is not None:
        report = check_trace(
            trace, greedy_tokens=load_golden(args.greedy), tie_tolerance=args.tie_tolerance, oracle_name=args.greedy
        )
    elif args.target is not None:
        spec = args.target or trace.target
        if not spec:
            raise UsageError(f"{args.file}: the trace header names no target; give --target SPEC")
        report = check_trace(
            trace,
            target=make_target(spec),
            tie_tolerance=args.tie_tolerance,
            oracle_name=spec,
            router_margin=args.router_margin,
        )
    else:
        report = check_trace(trace, tie_tolerance=args.tie_tolerance)
        # Say how to get the lossless verdict rather than leave a bare "skipped".
        report = attrs.evolve(
            report,
            results=tuple(
                attrs.evolve(r, detail="no oracle: give --greedy GOLDEN.json or --target [SPEC] to check it")
                if r.status == "skipped" and "oracle" in get(r.invariant).needs
                else r
                for r in report.results
            ),
        )

    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return report.exit_code
    console = Console()
    table = Table(
        title=(
            f"specproof check-trace — {escape(args.file)}\n{escape(trace.engine)} on {escape(trace.target)}: "
            f"{report.rounds} rounds, {report.tokens} tokens, stop: {trace.stop_reason}"
        )
    )
    table.add_column("invariant", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail")
    for result in report.results:
        style = _STYLE.get(result.status, "")
        table.add_row(result.invariant, f"[{style}]{result.status}[/]", escape(result.detail))
    console.print(table)
    for violation in report.violations:
        console.print(escape(str(violation)), highlight=False)
    console.print(_verdict_line(report), highlight=False, soft_wrap=True)
    return report.exit_code


def _verdict_line(report: Any) -> str:
    """The last line, as certify's: the verdict, the counts by status, and why when it is not a pass."""
    word = {0: "[green]PASS[/]", 1: "[bold red]FAIL[/]", 2: "[magenta]INCONCLUSIVE[/]"}[report.exit_code]
    counts: dict[str, int] = {}
    for result in report.results:
        counts[result.status] = counts.get(result.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no checks"
    why = ""
    if report.exit_code == 1:
        why = " — failed: " + ", ".join(r.invariant for r in report.results if r.status == "fail")
    elif report.exit_code == 2:
        why = " — undecided: " + ", ".join(r.invariant for r in report.results if r.status == "inconclusive")
    return f"verdict: {word} ({summary}); {report.rounds} rounds, {report.tokens} tokens{why}"
