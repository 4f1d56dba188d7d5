"""``specproof certify [drafter|target|engine|all]``: the release gate."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "certify",
        help="certify a drafter, target or engine against the invariant catalogue",
        description=(
            "Run the conformance suite. With no arguments it certifies the built-in stack: the n-gram drafter, "
            "SpecDecoder with checkpoint and replay rollback, and the reference target. Exit 0 when everything "
            "passes (excused counts as pass), 1 on any failure, 2 on a usage error."
        ),
    )
    p.add_argument("subject", nargs="?", default=None, choices=("drafter", "target", "engine", "all"))
    p.add_argument("--drafter", default=None, metavar="MODULE:ATTR", help="drafter to certify (default: ngram)")
    p.add_argument("--target", default=None, metavar="SPEC|MODULE:ATTR", help="target (default: reference)")
    p.add_argument("--engine", default=None, metavar="MODULE:ATTR", help="engine to certify")
    p.add_argument("--profile", default="quick", help="quick | ci | release (default quick)")
    p.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: derandomized)")
    p.add_argument("--tie-tolerance", type=float, default=None, help="top-2 margin under which a divergence is excused")
    p.add_argument("--only", action="append", default=[], metavar="ID", help="run only checks whose id contains ID")
    p.add_argument("--report", default=None, metavar="FILE", help="write the specproof-report/1 JSON here")
    p.add_argument("--markdown", default=None, metavar="FILE", help="write the Markdown certificate here")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from specproof.conformance._certifying import CertifyContext
    from specproof.conformance._profiles import get_profile
    from specproof.conformance._runner import certify
    from specproof.conformance.reports import write_json_report, write_markdown_report

    get_profile(args.profile)  # a usage error before anything is built
    ctx = CertifyContext.create(
        args.subject,
        drafter=args.drafter,
        target=args.target,
        engine=args.engine,
        profile=args.profile,
        seed=args.seed,
        tie_tolerance=args.tie_tolerance,
    )
    console = Console(stderr=args.json)
    with Progress(
        TextColumn("[bold]certify[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("collecting", total=None)

        def collected(n: int) -> None:
            progress.update(task, total=n, description="running")

        def finished(nodeid: str) -> None:
            progress.update(task, advance=1, description=nodeid.rpartition("[")[2].rstrip("]"))

        report = certify(ctx, only=args.only, on_collect=collected, on_result=finished)
    if args.report:
        write_json_report(args.report, report)
    if args.markdown:
        write_markdown_report(args.markdown, report)
    if report["verdict"] == "error":
        console.print(report.get("pytest_output", ""), markup=False)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_table(console, report, Table)
    return 0 if report["verdict"] == "pass" else 1


def _print_table(console, report, Table) -> None:  # type: ignore[no-untyped-def]
    subj = report["subjects"]
    title = (
        "specproof certify — "
        + ", ".join(
            x
            for x in (
                f"drafter {subj['drafter']['spec']}" if subj.get("drafter") else "",
                f"target {subj['target']['spec']}" if subj.get("target") else "",
                "engines " + "/".join(e["case"] for e in subj.get("engines", [])),
            )
            if x
        )
        + f" — profile {report['profile']}"
    )
    table = Table(title=title)
    for col in ("invariant", "case", "status", "examples", "seconds"):
        table.add_column(col, justify="right" if col in ("examples", "seconds") else "left", no_wrap=True)
    table.add_column("detail", overflow="fold")
    style = {"pass": "green", "excused": "yellow", "fail": "bold red", "error": "bold red", "skip": "dim"}
    for r in report["results"]:
        table.add_row(
            r["invariant"],
            r["case"],
            f"[{style[r['status']]}]{r['status']}[/]",
            str(r["examples"]),
            f"{r['seconds']:.2f}",
            r.get("detail") or "",
        )
    console.print(table)
    failures = [r for r in report["results"] if r["status"] in ("fail", "error")]
    for r in failures:
        console.rule(f"[bold red]{r['invariant']} ({r['case']})")
        for v in r.get("violations") or []:
            where = f" in round {v['round']}" if v.get("round") is not None else ""
            console.print(f"[{v['invariant']}]{where}: {v['explanation']}", markup=False)
            if v.get("expected") is not None or v.get("actual") is not None:
                console.print(f"    expected: {v['expected']}\n    actual:   {v['actual']}", markup=False)
            if v.get("example"):
                console.print(f"    minimal example: {json.dumps(v['example'], default=str)[:1500]}", markup=False)
        if r.get("reproduce"):
            console.print(f"    reproduce: {r['reproduce']}", markup=False)
    counts: dict[str, int] = {}
    for r in report["results"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    console.print(f"verdict: [bold]{report['verdict'].upper()}[/] ({summary}) in {report['seconds']:.1f} s")
