"""``specproof fuzz``: a randomized campaign over the certify checks, on many processes, that remembers."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from specproof._cli.certify import _hypothesis_dir as hypothesis_dir
from specproof._cli.certify import add_db_option, add_subject_options, open_db, print_database
from specproof.contract.validation import integer_argument
from specproof.formats import report as report_format

EPILOG = """Every worker runs the checks `certify` would run with a new random seed per round (a seeded
certify run: every failure has a reproduce line that works without the database) and saves what it
finds in the example database; every later `certify` against the same database replays it first.
Many machines: run `specproof fuzz --db redis://HOST:6379/0` on each. Stops at --for, when every
worker ran its --rounds, at --max-failures, when a shared database goes away (what was found is kept
in the local directory), or on Ctrl-C; then prints the campaign report. Exit status: 0 no failure,
1 a check failed, 2 usage error (nothing run), 3 nothing exercised, no round finished, fewer rounds
than --rounds asked for, a worker died or did not finish (its exit status or signal is in the
report), or the shared database went away before any failure, 130 Ctrl-C, 143 SIGTERM (both with
the partial report). --workers is at most 4 per CPU and what the available memory holds at about
100 MB each."""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "fuzz",
        help="a randomized campaign over the certify checks, on many workers, saving what it finds",
        description=(
            "Fuzz the same subjects and invariants as `certify` (same plug-in specs, --only, tolerances), "
            "randomized, on --workers processes sharing one example database, for --for DURATION, --rounds N "
            "per worker, or until --max-failures N (whichever comes first)."
        ),
        epilog=EPILOG,
    )
    add_subject_options(p, verb="fuzz")
    p.add_argument(
        "--profile",
        default="quick",
        help="quick | ci | release: how much each round searches and how large its examples are; failures are "
        "saved under this profile, so the gate that replays them uses the same one (default quick)",
    )
    p.add_argument(
        "--for",
        dest="duration",
        default=None,
        metavar="DURATION",
        help="stop after this long: 90, 90s, 10m, 8h (default: until --rounds, --max-failures, or Ctrl-C); what a "
        "time budget reaches depends on the machine's load: --rounds for a reach that does not",
    )
    p.add_argument(
        "--rounds",
        type=integer_argument,
        default=None,
        metavar="N",
        help="stop when every worker has run N rounds (N >= 1; with --seed S, worker w runs the seeds S + w + W * r, "
        "r < N: the same campaign at any load); with --for as well, fewer rounds by then is INCONCLUSIVE",
    )
    p.add_argument(
        "--max-failures",
        type=integer_argument,
        default=None,
        metavar="N",
        help="stop when N checks have failed (N >= 1)",
    )
    p.add_argument(
        "--workers",
        type=integer_argument,
        default=1,
        metavar="W",
        help="worker processes (default 1; at most 4 per CPU and about 100 MB of available memory each)",
    )
    p.add_argument(
        "--seed",
        type=integer_argument,
        default=None,
        help="base seed: worker w's round r uses seed + w + W * r (a reproducible campaign); default random",
    )
    p.add_argument("--report", default=None, metavar="FILE", help=f"write the campaign's {report_format.ID} JSON here")
    p.add_argument("--markdown", default=None, metavar="FILE", help="write the campaign's Markdown certificate here")
    p.add_argument("--junitxml", default=None, metavar="FILE", help="write JUnit XML (one testcase per check) here")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.add_argument(
        "--hypothesis-dir",
        default=None,
        metavar="DIR",
        help="Hypothesis' storage directory (default $SPECPROOF_HYPOTHESIS_DIR, else ~/.cache/specproof/hypothesis)",
    )
    add_db_option(p)
    p.set_defaults(func=run)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    from specproof.contract import UsageError

    match = _DURATION.match(text)
    if match is None or float(match[1]) <= 0:
        raise UsageError(f"--for {text!r}: a duration is a positive number of seconds, or 90s, 10m, 8h")
    return float(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2] or "s"]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from specproof.conformance import Plan
    from specproof.conformance import cli_support as cli
    from specproof.conformance.reports import (
        EXIT_CODES,
        check_output_path,
        render_junit,
        write_json_report,
        write_markdown_report,
        write_text_file,
    )
    from specproof.contract import UsageError

    # every option is checked before any work: outputs, numbers, the database, the plan itself
    for option, path in {"--report": args.report, "--markdown": args.markdown, "--junitxml": args.junitxml}.items():
        if path:
            check_output_path(path, option=option)
    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: at least one worker")
    most, why = cli.max_workers()
    if args.workers > most:
        raise UsageError(f"--workers {args.workers}: this machine holds at most {most} ({why})")
    for option, number in (("--max-failures", args.max_failures), ("--rounds", args.rounds)):
        if number is not None and number < 1:
            raise UsageError(f"{option} {number}: at least 1")
    duration = parse_duration(args.duration) if args.duration is not None else None
    storage = hypothesis_dir(args.hypothesis_dir)
    store = open_db(args, storage)  # unreachable Redis, a bad path: exit 2 now
    # the plan of every round: certify's options as the plan takes them (fuzz's --seed is a base seed, not one)
    plan_args = cli.plan_arguments(vars(args), (*cli.SUBJECT_OPTIONS, "profile"))
    plan = Plan.create(**plan_args)  # bad specs, ids, tolerances: a usage error before any worker starts
    plan.close()
    options = cli.CampaignOptions(
        plan=plan_args,
        db=args.db,
        hypothesis_dir=str(storage),
        workers=args.workers,
        duration=duration,
        rounds=args.rounds,
        max_failures=args.max_failures,
        seed=args.seed,
    )
    terminal = sys.stderr.isatty() if args.json else sys.stdout.isatty()
    console = Console(
        file=sys.stderr if args.json else sys.stdout, soft_wrap=not terminal, width=None if terminal else 10_000
    )
    where = store.spec if store is not None else "none"
    console.print(
        f"fuzz: {args.workers} worker(s), profile {args.profile}, database {where}"
        + (f", for {duration:g} s" if duration else "")
        + (f", {args.rounds} round(s) per worker" if args.rounds else "")
        + (f", until {args.max_failures} failure(s)" if args.max_failures else ""),
        markup=False,
        soft_wrap=True,
    )
    state = _run_live(options, cli.run_campaign, console, terminal)
    report = state.report()
    if state.stopped.startswith("interrupted"):  # the word certify gives a Ctrl-C, whatever finished before it
        report["verdict"] = "interrupted"
        report["verdict_reason"] = f"{state.stopped}: the report holds the checks that finished"
    if args.report:
        write_json_report(args.report, report)
    if args.markdown:
        write_markdown_report(args.markdown, report)
    if args.junitxml:
        write_text_file(args.junitxml, render_junit(report))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        from specproof._cli.certify import _print_table

        _print_table(console, report)
        _print_campaign(console, report)
    print_database(console, report)
    if state.stopped.startswith("interrupted"):
        return 143 if "SIGTERM" in state.stopped else 130
    return EXIT_CODES.get(report["verdict"], 1)


def _line(w: Any, seconds: float) -> str:
    rate = w.examples / seconds if seconds > 0 else 0.0
    paths = ", ".join(f"{p.replace('_', ' ')} {n}" for p, n in w.paths.items() if p not in ("generations", "completed"))
    return (
        f"worker {w.index}: round {w.rounds} (seed {w.seed}), {w.examples} examples ({rate:.1f}/s), "
        f"{w.failures} failure(s), new coverage {w.new_coverage}; rounds by path: {paths or '-'}"
    )


def _run_live(options: Any, run_campaign: Any, console: Any, terminal: bool) -> Any:
    """A live line per worker on a terminal; in a log, a line per worker at its first round and per minute,
    and every failure at once."""
    if not terminal:
        last = [time.perf_counter()]
        said_lost = [False]

        def log(state: Any, kind: str, index: int, payload: Any) -> None:
            if state.lost and not said_lost[0]:  # at once: a frozen Redis is news, not a line at the end
                said_lost[0] = True
                console.print(f"[{state.seconds:7.1f} s] {state.lost}; stopping", markup=False, soft_wrap=True)
            if kind == "check" and payload["status"] in ("fail", "error") and state.failures:
                f = state.failures[-1]
                if f["id"] == payload["id"] and f["worker"] == index:
                    console.print(
                        f"[{state.seconds:7.1f} s] worker {index} FAILED {payload['id']}: "
                        f"reproduce: {payload['reproduce']}",
                        markup=False,
                        soft_wrap=True,
                        highlight=False,
                    )
            if kind == "round" and state.workers[index].rounds == 1:  # it is running: said once, not per minute
                w = state.workers[index]
                console.print(f"[{state.seconds:7.1f} s] {_line(w, state.seconds)}", markup=False, soft_wrap=True)
            now = time.perf_counter()
            if now - last[0] >= 60:
                last[0] = now
                for w in state.workers:
                    console.print(f"[{state.seconds:7.1f} s] {_line(w, state.seconds)}", markup=False, soft_wrap=True)

        return run_campaign(options, on_event=log)

    from rich.live import Live
    from rich.text import Text

    def render(state: Any) -> Text:
        lines = [f"fuzz {state.seconds:6.1f} s — {state.examples} examples, {state.failed()} failing check(s)"]
        lines += [_line(w, state.seconds) for w in state.workers]
        lines += [f"  FAILED {f['id']} (worker {f['worker']}, {f['seconds']:.1f} s)" for f in state.failures]
        lines += [f"  {state.lost}; stopping"] if state.lost else []
        return Text("\n".join(lines))

    with Live(console=console, refresh_per_second=4, transient=True) as live:

        def update(state: Any, kind: str, index: int, payload: Any) -> None:
            live.update(render(state))

        return run_campaign(options, on_event=update)


def _print_campaign(console: Any, report: dict[str, Any]) -> None:
    c = report["campaign"]
    ttf = c["time_to_first_failure"]
    first = f"; first failure after {ttf:.1f} s" if ttf is not None else "; no failure"
    console.print(
        f"campaign: {c['workers']} worker(s), {c['rounds']} round(s), {c['examples']} examples in "
        f"{c['seconds']:.1f} s{first}; stopped: {c['stopped']}",
        markup=False,
        soft_wrap=True,
    )
    for e in c["worker_errors"]:
        console.print(f"worker error: {e}", markup=False, soft_wrap=True)
    for lost in c.get("workers_lost") or ():
        console.print(f"worker {lost['worker']} lost: {lost['why']}", markup=False, soft_wrap=True)
