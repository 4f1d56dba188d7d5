"""``specproof certify [drafter|target|engine|all]``: the release gate."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EPILOG = """exit status: 0 PASS (excused counts as a pass), 1 FAIL, 2 usage error (nothing run, nothing written),
3 INCONCLUSIVE (nothing failed, but some requested subject had no check pass on exercised examples:
not a pass), 130 interrupted by Ctrl-C, 143 by SIGTERM (the partial report is written, marked interrupted)."""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "certify",
        help="certify a drafter, target or engine against the invariant registry",
        description=(
            "Run the conformance suite. With no arguments it certifies the built-in stack: the n-gram drafter, "
            "SpecDecoder with checkpoint and replay rollback, and the reference target."
        ),
        epilog=EPILOG,
    )
    from specproof.conformance.cli_support import add_to_argparse

    add_subject_options(p, verb="certify")
    add_to_argparse(
        p,
        [
            "profile",
            "sampling",
            "batches",
            "decode_state",
            "trees",
            "seed",
            "max_context",
            "expect_fail",
            "expect_fail_file",
            "report",
            "markdown",
        ],
        verb="certify",
    )
    p.add_argument("--junitxml", default=None, metavar="FILE", help="write JUnit XML (one testcase per check) here")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    add_to_argparse(p, ["replay_session", "hypothesis_dir"], verb="certify")
    add_db_option(p)
    add_to_argparse(p, ["db_replay"], verb="certify")
    p.set_defaults(func=run)


def _hypothesis_dir(arg: str | None) -> Path:
    """``--hypothesis-dir`` (else its defaults), with its ``sessions/`` written to once: a directory
    that cannot hold a failing session's history is a usage error before any work."""
    from specproof.conformance.cli_support import check_storage, storage_dir

    storage = storage_dir(arg)
    check_storage(storage)
    return storage


def add_subject_options(p: argparse.ArgumentParser, *, verb: str) -> None:
    """What to check and how strictly: the options `certify` and `fuzz` share (one definition for both,
    and for the pytest plugin: conformance/_options.py)."""
    from specproof.conformance.cli_support import SUBJECT_OPTIONS, add_to_argparse

    add_to_argparse(p, SUBJECT_OPTIONS, verb=verb)


def add_db_option(p: argparse.ArgumentParser) -> None:
    from specproof.conformance.cli_support import add_to_argparse

    add_to_argparse(p, ["db"], verb="certify")


def open_db(args: argparse.Namespace, storage: Path) -> Any:
    """``--db`` opened (a UsageError before any work when it is bad or unreachable)."""
    from specproof.conformance.cli_support import default_examples_dir, open_database

    return open_database(args.db, default_dir=default_examples_dir(storage), replay=getattr(args, "db_replay", "all"))


def run(args: argparse.Namespace) -> int:
    from specproof.conformance import Plan
    from specproof.conformance.cli_support import run_plan as certify
    from specproof.conformance.reports import check_output_path

    # Everything the user gave is checked before any work: paths first (nothing is created), then
    # the options as the plan takes them (the one mapping from OPTIONS: Plan.from_options)
    if args.junitxml:
        check_output_path(args.junitxml, option="--junitxml")
    storage = _hypothesis_dir(args.hypothesis_dir)  # (and its sessions/ can be written)
    # SIGTERM (what CI timeouts and service managers send) is handled like Ctrl-C from here on
    with _sigterm_as_interrupt(stoppable=(Plan.from_options, _pytest_main())) as terminated:
        try:
            plan = Plan.from_options(vars(args))  # (the example database opened: one that cannot be written is exit 2)
        except KeyboardInterrupt:
            # loading the subjects (an engine's handshake, a model) can take minutes; a report names
            # its subjects, so none can be written yet: say so, never end silently
            signal_name = "SIGTERM" if terminated.is_set() else "Ctrl-C"
            print(
                f"verdict: INTERRUPTED ({signal_name} while loading the subjects: no check ran, no report written)",
                file=sys.stderr,
            )
            return 143 if terminated.is_set() else 130
        return _certify(args, plan, storage, certify, terminated)


def _pytest_main() -> Any:
    import pytest

    return pytest.main


def _certify(args: argparse.Namespace, plan: Any, storage: Path, certify: Any, terminated: _Signalled) -> int:
    """Run the loaded plan; its report written and its verdict printed, interrupted or not."""
    from rich.console import Console

    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = str(storage)
    try:
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(str(storage))
    except ImportError:  # pragma: no cover - older Hypothesis
        pass

    terminal = sys.stderr.isatty() if args.json else sys.stdout.isatty()
    # bound to the real stream now: the in-process pytest run redirects sys.stdout while it runs
    console = Console(
        file=sys.stderr if args.json else sys.stdout, soft_wrap=not terminal, width=None if terminal else 10_000
    )
    # on SIGTERM the engines are stopped, the partial report is written, the verdict line printed,
    # and the exit status is 143
    report = _run_with_progress(plan, certify, console, terminal, terminated).to_json()
    if terminated.is_set() and report.get("verdict") == "interrupted":
        report["verdict_reason"] = "interrupted (SIGTERM): the report holds the checks that finished"
    return _finish(args, report, console, 143 if terminated.is_set() else None)


def _finish(args: argparse.Namespace, report: dict[str, Any], console: Any, status: int | None) -> int:
    """Write the reports asked for, print the table (or the JSON) and the verdict line; the exit status."""
    from specproof.conformance.reports import (
        EXIT_CODES,
        render_junit,
        write_json_report,
        write_markdown_report,
        write_text_file,
    )

    if args.report:
        write_json_report(args.report, report)
    if args.markdown:
        write_markdown_report(args.markdown, report)
    if args.junitxml:
        write_text_file(args.junitxml, render_junit(report))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_table(console, report)
    if report.get("pytest_output"):
        console.print(report["pytest_output"], markup=False)
    print_database(console, report)
    return status if status is not None else EXIT_CODES.get(report["verdict"], 1)


class _Terminated(KeyboardInterrupt):
    """SIGTERM in ``certify``: stopped as Ctrl-C stops it (the in-process pytest run ends as interrupted)."""


class _Signalled(threading.Event):
    """Set when a SIGTERM came; ``pending``: it came where it could not stop the run (raised later)."""

    pending = False


@contextlib.contextmanager
def _sigterm_as_interrupt(*, stoppable: tuple[Any, ...] = ()) -> Iterator[_Signalled]:
    """The first SIGTERM raises ``_Terminated`` (a ``KeyboardInterrupt``) in the main thread where
    it stops the run cleanly: inside one of the ``stoppable`` functions (loading the plan, and the
    pytest run, which ends as interrupted and keeps what finished). Anywhere else (between them,
    while the engines stop, while the report is written) it is only recorded: raised there, it would
    end ``certify`` with no report; the run stops at the next check's end (``_stop_if_pending``)
    or, when the checks are over, exits 143 with the whole report. The event it yields says one came.
    Another SIGTERM is ignored (it must not cut the report short). Outside the main thread (a
    caller's thread) nothing is installed."""
    came = _Signalled()
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    codes = {getattr(fn, "__code__", None) or fn.__func__.__code__ for fn in stoppable}

    def on_sigterm(signum: int, frame: Any) -> None:
        if came.is_set():
            return
        came.set()
        while frame is not None and frame.f_code not in codes:
            frame = frame.f_back
        if frame is None:
            came.pending = True
            return
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield came
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_if_pending(came: _Signalled) -> None:
    """A SIGTERM that came before the pytest run started stops it at the first check's end."""
    if came.pending:
        came.pending = False
        raise _Terminated()


def _run_with_progress(plan: Any, certify: Any, console: Any, terminal: bool, terminated: _Signalled) -> Any:
    """A progress bar on a terminal; in a log, one line per finished check as the run goes."""
    if not terminal:

        def line(result: Any) -> None:
            console.print(
                f"{result.status:<8} {result.nodeid}  ({result.examples} examples, {result.exercised} exercised, "
                f"{result.seconds:.1f} s)",
                markup=False,
                highlight=False,
            )
            _stop_if_pending(terminated)

        return certify(plan, on_result=line)[1]

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]certify[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("running", total=None)

        def start(n: int) -> None:
            progress.update(task, total=n)

        def finished(result: Any) -> None:
            progress.update(task, advance=1, description=result.nodeid)
            _stop_if_pending(terminated)

        return certify(plan, on_start=start, on_result=finished)[1]


def print_database(console: Any, report: dict[str, Any]) -> None:
    """What the example database replayed, and its warnings (corrupted entries, a server gone)."""
    db = report.get("database")
    if not db:
        return

    def say(text: str) -> None:
        console.print(text, markup=False, soft_wrap=True)

    replayed = sum(db["replayed"].values())
    if replayed:
        say(
            f"example database {db['spec']}: {replayed} saved failing example(s) replayed "
            f"({', '.join(sorted(db['replayed']))})"
        )
    covering = db.get("covering_replayed") or {}
    if covering:
        paths = sorted({p for case in db.get("covering_paths", {}).values() for p in case})
        say(
            f"example database {db['spec']}: replayed {sum(covering.values())} covering example(s) of paths this "
            f"run's search did not reach ({', '.join(paths) or 'none reached again'})"
        )
    saved = db.get("covering_saved") or {}
    if saved:
        say(
            f"example database {db['spec']}: saved {sum(saved.values())} covering example(s) (new or smaller, "
            f"per engine case and path)"
        )
    for warning in db["warnings"]:
        say(f"warning: example database: {warning}")


_STATUS_STYLE = {
    "pass": "green",
    "excused": "yellow",
    "fail": "bold red",
    "error": "bold red",
    "skip": "dim",
    "xfail": "yellow",
    "xpass": "bold red",
    "consequence": "red",  # failed only because the drafter did: told once, under the drafter's check
}


def _print_shared_failure(console: Any, cause: str, group: list[dict[str, Any]]) -> None:
    from specproof.conformance.reports import stopped_checks

    header = f"one failure stopped {len(group)} checks"
    if console.is_terminal:
        console.rule(f"[bold red]{header}")
    else:
        console.print(f"──── {header} ────", markup=False)
    console.print(cause, markup=False)
    console.print(f"    checks it stopped: {stopped_checks(group)}", markup=False)
    example = next((v["example"] for r in group for v in r.get("violations") or () if v.get("example")), None)
    if example:
        console.print(f"    minimal example: {json.dumps(example, default=str)[:3000]}", markup=False)
    if group[0].get("reproduce"):
        console.print(f"    reproduce: {group[0]['reproduce']}", markup=False, soft_wrap=True, highlight=False)


def _print_table(console: Any, report: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    from specproof.conformance.reports import failure_groups, sampling_lines, speculation_lines

    subj = report["subjects"]
    parts = [
        f"drafter {subj['drafter']['spec']}" if subj.get("drafter") else "",
        f"target {subj['target']['spec']}" if subj.get("target") else "",
        ("engines " + "/".join(e["case"] for e in subj["engines"])) if subj.get("engines") else "",
    ]
    command = "specproof fuzz" if report.get("campaign") else "specproof certify"
    title = f"{command} — " + (", ".join(x for x in parts if x) or "nothing") + f" — profile {report['profile']}"
    table = Table(title=Text(title))  # plain text: ":eagle:" in a spec (tree:dynamic:16:eagle:trained) is no emoji
    for col in ("check", "status", "examples", "exercised", "seconds"):
        table.add_column(col, justify="left" if col in ("check", "status") else "right", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for r in report["results"]:
        table.add_row(
            Text(r["id"]),  # plain text: "[engine.stop]" in a detail is not rich markup
            f"[{_STATUS_STYLE.get(r['status'], '')}]{r['status']}[/]",
            str(r["examples"]),
            str(r["exercised"]),
            f"{r['seconds']:.2f}",
            Text(r.get("detail") or ""),
        )
    console.print(table)
    coverage = report.get("path_coverage") or {}
    if coverage:
        paths = [p for p in next(iter(coverage.values())) if p not in ("generations", "completed")]
        cov = Table(title="path coverage (rounds by path; 0 = never exercised)")
        cov.add_column("case", no_wrap=True)
        for col in ("generations", "completed", *paths):
            cov.add_column(col.replace("_", " "), justify="right")
        for case, row in coverage.items():
            cov.add_row(case, *(str(row[c]) for c in ("generations", "completed", *paths)))
        console.print(cov)
    _print_request_coverage(console, report)
    for e in subj.get("engines") or ():
        for note in e.get("notes") or ():
            console.print(f"note ({e['case']}): {note}", markup=False)
    for u in subj.get("used") or ():
        console.print(f"used, not certified: {u}", markup=False)
    for line in speculation_lines(report)[1:]:  # drafted and accepted counts of each speculating engine case
        console.print(line.replace("### ", ""), markup=False)
    for line in sampling_lines(report)[1:]:  # the sampling checks' sizes, bound and sensitivity
        console.print(line.replace("## ", "").replace("`", ""), markup=False)
    for cause, group in failure_groups([r for r in report["results"] if r["status"] in ("fail", "error")]):
        if cause is not None:  # one failure (every request crashed) told once, with the checks it stopped
            _print_shared_failure(console, cause, group)
            continue
        (r,) = group
        if console.is_terminal:
            console.rule(f"[bold red]{r['invariant']} ({r['case']})")
        else:  # a log: a short header, not a rule as wide as the (unbounded) log width
            console.print(f"──── {r['invariant']} ({r['case']}) ────", markup=False)
        for v in r.get("violations") or []:
            where = f" in round {v['round']}" if v.get("round") is not None else ""
            console.print(f"[{v['invariant']}]{where}: {v['explanation']}", markup=False)
            if v.get("expected") is not None or v.get("actual") is not None:
                console.print(f"    expected: {v['expected']}\n    actual:   {v['actual']}", markup=False)
            if v.get("example"):
                console.print(f"    minimal example: {json.dumps(v['example'], default=str)[:3000]}", markup=False)
        if r["status"] == "error":
            console.print(f"    error: {r['detail']}", markup=False)
        if r.get("reproduce"):
            # one line, never wrapped: it must paste back into a shell
            console.print(f"    reproduce: {r['reproduce']}", markup=False, soft_wrap=True, highlight=False)
    counts: dict[str, int] = {}
    for r in report["results"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no checks"
    reason = f" — {report['verdict_reason']}" if report.get("verdict_reason") else ""
    console.print(
        f"verdict: [bold]{report['verdict'].upper()}[/] ({summary}) in {report['seconds']:.1f} s{reason}",
        soft_wrap=True,
    )


def _print_request_coverage(console: Any, report: dict[str, Any]) -> None:
    """The request-coverage table on screen (0 = never reached: the check is inconclusive)."""
    from rich.table import Table

    from specproof.conformance.reports import request_coverage_lines, request_coverage_rows

    columns, rows = request_coverage_rows(report)
    if not rows:
        return
    table = Table(title="request coverage (calls or requests by relation to the one before; 0 = never reached)")
    table.add_column("check", no_wrap=True)
    for col in columns:
        table.add_column(col.replace("_", " "), justify="right")
    for check, cells in rows:
        table.add_row(check, *cells)
    console.print(table)
    for line in request_coverage_lines(report)[len(rows) + 5 :]:  # the never-reached line, if any
        if line:
            console.print(line, markup=False)
