"""Fuzzing campaigns: ``specproof fuzz`` runs the certify checks, randomized, on many processes.

A campaign is the plan ``certify`` would run (the same subjects, plug-in specs, ``--only``
and tolerances) searched over and over with a new seed per round, by ``workers`` processes
that share one example database (docs/contract.md, "the example database"): a failure any
worker finds is shrunk, saved, and replayed by every later run — another worker, another
machine sharing the Redis database, or the next derandomized ``certify`` gate.

Why plain processes, not HypoFuzz: HypoFuzz fuzzes single ``@given`` tests collected by pytest.
specproof's checks are drivers over several Hypothesis searches — one search per engine case
feeds every engine invariant and is searched again per invariant only to shrink; the session
machine shrinks request histories itself; the rollback machine draws rollback strategies per
conversation — so there is no one ``@given`` test per check for HypoFuzz to drive without
losing the verdict, the counts and the reproduce line ``certify`` gives. A round here is
exactly a seeded ``certify`` run, so every failure comes with a reproduce line that works
without the database (``--seed``), and the database carries it to every later run.

The parent process aggregates what the workers report (per check: examples, exercised,
failures; per engine case: rounds by path) into a report (``specproof.formats.report``) with a
``campaign`` section, rendered by the same writers as ``certify``'s.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs

from specproof.formats import report as report_format

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._database import ExampleStore
    from specproof.conformance._plan import Plan

__all__ = ["CampaignOptions", "CampaignState", "Terminated", "max_workers", "run_campaign"]

WORKERS_PER_CPU = 4  # rounds are CPU-bound: more workers than this per CPU only queue
WORKER_MEMORY = 100 * 2**20  # bytes a worker holds (measured about 73 MB at quick), with headroom


class Terminated(KeyboardInterrupt):
    """SIGTERM (what CI timeouts and service managers send) in the campaign's parent: stopped like Ctrl-C."""


def _available_memory() -> int | None:
    """Bytes of memory available now (Linux' MemAvailable, else free pages), None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def max_workers() -> tuple[int, str]:
    """The most workers this machine can hold, and why: WORKERS_PER_CPU per usable CPU, and no more
    than the available memory holds at WORKER_MEMORY each (at least one)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    limit, why = WORKERS_PER_CPU * cpus, f"{WORKERS_PER_CPU} per CPU on {cpus} CPU(s)"
    memory = _available_memory()
    if memory is not None and memory // WORKER_MEMORY < limit:
        limit = max(1, memory // WORKER_MEMORY)
        why = f"about {WORKER_MEMORY // 2**20} MB each in {memory / 2**30:.1f} GiB of available memory"
    return limit, why


def describe_exit(exitcode: int | None, *, sent: Iterable[int] = (), after: float | None = None) -> str:
    """A worker's end in words: its exit status, or the signal that killed it.

    ``sent``: the signals the campaign itself sent the worker (``after`` seconds past the stop): a
    worker ended by one of them was "terminated by the campaign"; the out-of-memory hint is given
    only for a SIGKILL the campaign did not send."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode in set(sent):
            when = f" after {after:.0f} s" if after is not None else ""
            return f"terminated by the campaign{when} ({name})"
        return f"killed by {name}" + (" (the out-of-memory killer sends it too)" if name == "SIGKILL" else "")
    return f"exited with status {exitcode}"


@attrs.frozen(kw_only=True)
class CampaignOptions:
    """What a campaign runs and for how long (validated by the CLI before any work)."""

    plan: dict[str, Any]  # Plan.create keyword arguments (subject, specs, profile, tolerances, only)
    db: str | None  # the --db value (None: the default directory)
    hypothesis_dir: str
    workers: int = 1
    duration: float | None = None  # seconds; None: until rounds, max_failures or Ctrl-C
    rounds: int | None = None  # rounds per worker; None: until duration, max_failures or Ctrl-C
    max_failures: int | None = None
    seed: int | None = None  # base seed: worker w's round r uses seed + w + workers * r


@attrs.define
class WorkerState:
    index: int
    rounds: int = 0  # rounds it finished (a round cut short by the stop is not counted: its checks are)
    examples: int = 0
    failures: int = 0
    paths: Counter[str] = attrs.Factory(Counter)
    new_coverage: int = 0  # path kinds this worker reached first in the campaign
    seed: int | None = None
    done: bool = False
    error: str | None = None
    exitcode: int | None = None  # the process' exit status (negative: the signal that killed it)
    lost: str | None = None  # why it ended without finishing (died, or terminated mid-check); None: it did


@attrs.define
class CampaignState:
    """Everything the workers reported, merged: what the live lines and the final report show."""

    options: CampaignOptions
    started: float = attrs.Factory(time.perf_counter)
    workers: list[WorkerState] = attrs.Factory(list)
    checks: dict[str, dict[str, Any]] = attrs.Factory(dict)  # check id -> merged result
    coverage: dict[str, Counter[str]] = attrs.Factory(dict)  # engine case -> rounds by path (+ generations)
    failures: list[dict[str, Any]] = attrs.Factory(list)  # the first failure of each check, shrunk
    first_failure: float | None = None
    skeleton: dict[str, Any] | None = None  # the first round's report: subjects, profile, versions
    databases: dict[int, dict[str, Any]] = attrs.Factory(dict)  # worker -> its store's latest account
    lost: str | None = None
    stopped: str = ""

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def examples(self) -> int:
        return sum(w.examples for w in self.workers)

    def absorb_check(self, worker: int, result: dict[str, Any]) -> bool:
        """Merge one finished check; True when it is a new failing check."""
        w = self.workers[worker]
        w.examples += int(result["examples"])
        merged = self.checks.get(result["id"])
        if merged is None:
            merged = self.checks[result["id"]] = {**result, "examples": 0, "exercised": 0, "seconds": 0.0}
            merged.pop("request_coverage", None)
            merged["status"] = "skip" if result["status"] == "skip" else "pass"
        merged["examples"] += int(result["examples"])
        merged["exercised"] += int(result["exercised"])
        if result.get("request_coverage"):  # the request relations reached, summed over the rounds
            reached = merged.get("request_coverage") or {}
            merged["request_coverage"] = {
                tag: int(reached.get(tag, 0)) + int(n) for tag, n in result["request_coverage"].items()
            }
        merged["seconds"] = round(float(merged["seconds"]) + float(result["seconds"]), 3)
        if result["status"] == "pass" and merged["status"] == "skip":
            merged["status"], merged["detail"] = "pass", ""
        if result["status"] in ("fail", "error") and merged["status"] not in ("fail", "error"):
            for key in ("status", "detail", "violations", "reproduce"):
                merged[key] = result.get(key)
            w.failures += 1
            if self.first_failure is None:
                self.first_failure = self.seconds
            self.failures.append({"worker": worker, "seconds": round(self.seconds, 3), **result})
            return True
        return False

    def absorb_round(self, worker: int, report: dict[str, Any], *, complete: bool = True) -> None:
        """Merge one round's report; ``complete=False``: a round the stop cut short (its checks and
        coverage count, the round does not)."""
        w = self.workers[worker]
        w.rounds += int(complete)
        if self.skeleton is None:
            self.skeleton = report
        if report.get("database"):
            self.databases[worker] = report["database"]  # (a worker's store counts over all its rounds)
        for case, row in (report.get("path_coverage") or {}).items():
            total = self.coverage.setdefault(case, Counter())
            for path, n in row.items():
                if n and not total[path]:
                    w.new_coverage += 1
                total[path] += int(n)
                w.paths[path] += int(n)

    def database(self) -> dict[str, Any] | None:
        """The workers' database accounts merged: counts summed, warnings once each."""
        accounts = [self.databases[w] for w in sorted(self.databases)]
        if not accounts:
            return None
        merged = dict(accounts[0])
        for field in ("replayed", "covering_replayed", "covering_saved", "republished"):
            total: Counter[str] = Counter()
            for account in accounts:
                total.update(account.get(field) or {})
            merged[field] = dict(total)
        paths: dict[str, list[str]] = {}
        for account in accounts:  # the paths any worker replayed covering examples for, per case
            for case, names in (account.get("covering_paths") or {}).items():
                paths[case] = sorted({*paths.get(case, ()), *names})
        merged["covering_paths"] = paths
        merged["warnings"] = list(dict.fromkeys(w for a in accounts for w in a.get("warnings") or ()))
        merged["unsaved"] = list(dict.fromkeys(u for a in accounts for u in a.get("unsaved") or ()))
        merged["lost"] = next((a["lost"] for a in accounts if a.get("lost")), None)
        return merged

    def failed(self) -> int:
        return len(self.failures)

    @property
    def rounds(self) -> int:
        return sum(w.rounds for w in self.workers)

    def short_of_rounds(self) -> str | None:
        """Why the campaign reached less than it was asked for, in words; None when it did not:
        no round finished at all, or fewer than ``--rounds`` on a worker that was not lost."""
        if self.rounds == 0:
            return f"the campaign finished no round ({self.stopped or 'stopped before its first'})"
        asked = self.options.rounds
        if asked is not None and any(w.rounds < asked and not w.lost for w in self.workers):
            return (
                f"{self.rounds} of the {asked * self.options.workers} round(s) asked for ran "
                f"(--rounds {asked} on {self.options.workers} worker(s)): {self.stopped or 'stopped early'}"
            )
        return None

    def report(self) -> dict[str, Any]:
        """The campaign as a report dict (the certify report's fields, plus ``campaign``)."""
        base = dict(self.skeleton or {})
        results = list(self.checks.values())
        failing = [r for r in results if r["status"] in ("fail", "error")]
        if failing:
            verdict, why = "fail", f"{len(failing)} check(s) failed in the campaign"
        elif any(r["status"] == "pass" for r in results):
            verdict, why = "pass", None
        else:
            verdict, why = "inconclusive", "the campaign exercised no check"
        short = self.short_of_rounds()
        if short and not failing:  # fewer rounds than asked (or none): what was reached is not what was claimed
            verdict, why = "inconclusive", short
        if self.lost and not failing:
            verdict, why = "inconclusive", self.lost
        lost = [w for w in self.workers if w.lost]
        if lost and not failing:  # a dead worker's rounds are missing: what they would have found is unknown
            verdict = "inconclusive"
            why = f"{len(lost)} of {self.options.workers} worker(s) did not finish: " + "; ".join(
                f"worker {w.index} {w.lost}" for w in lost
            )
        unsaved = (self.database() or {}).get("unsaved") or []
        if unsaved:  # a find the example database did not keep: never a pass
            not_kept = f"the example database did not keep {len(unsaved)} example(s) ({'; '.join(unsaved[:3])})"
            verdict, why = "fail", f"{why}; {not_kept}" if why else not_kept
        base.update(
            verdict=verdict,
            verdict_reason=why,
            seed=self.options.seed,
            derandomized=False,
            seconds=round(self.seconds, 3),
            results=results,
            path_coverage={case: dict(c) for case, c in self.coverage.items()},
            database=self.database(),
            campaign={
                "workers": self.options.workers,
                "rounds": self.rounds,
                "examples": self.examples,
                "seconds": round(self.seconds, 3),
                "time_to_first_failure": None if self.first_failure is None else round(self.first_failure, 3),
                "failures": [
                    {"check": f["id"], "worker": f["worker"], "seconds": f["seconds"], "reproduce": f["reproduce"]}
                    for f in self.failures
                ],
                "exercised": {r["id"]: r["exercised"] for r in results},
                "stopped": self.stopped,
                "lost": self.lost,
                "worker_errors": [w.error for w in self.workers if w.error],
                "workers_lost": [
                    {"worker": w.index, "exitcode": w.exitcode, "rounds": w.rounds, "why": w.lost} for w in lost
                ],
            },
        )
        if self.skeleton is None:  # no round finished (Ctrl-C or dead workers early): still a whole report
            base.update(_report_defaults(self.options.plan))
        return base


def _report_defaults(plan: dict[str, Any]) -> dict[str, Any]:
    """The fields a campaign report takes from a worker's first round report, for a campaign with
    none: what the parent knows itself, so the report still matches specproof/schemas/report-2.json."""
    import platform
    import sys

    import hypothesis
    import numpy as np

    from specproof._version import __version__

    return {
        "format": report_format.ID,
        "specproof_version": __version__,
        "subjects": {"subject": plan.get("subject"), "engines": [], "used": []},
        "profile": plan.get("profile", "quick"),
        "only": list(plan.get("only") or ()),
        "expected_failures": [],
        "tie_tolerance": plan.get("tie_tolerance"),
        "atol": plan.get("atol"),
        "hypothesis_version": hypothesis.__version__,
        "numpy_version": np.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "unreached_paths": {},
    }


def _worker(index: int, options: CampaignOptions, conn: Any) -> None:
    """One worker process: seeded certify rounds until told to stop (or its database goes away).

    ``conn`` is this worker's own end of its pipe to the parent (one per worker: no lock is shared
    with another worker, so a worker killed mid-report cannot block the others; the parent reads a
    half-written report as the end of the pipe). The parent asks it to stop by writing to the pipe;
    the pipe's end (the parent gone) stops it too, between checks, and the death signal and the
    parent watchdog (wire/_lifetime.py) end it at once, mid-check included.
    """
    from specproof.wire import die_with_parent, exit_with_parent

    die_with_parent(os.getppid())
    parent = mp.parent_process()
    if parent is not None:
        exit_with_parent(parent.sentinel)
    # Ctrl-C reaches the whole process group: the parent handles it and asks for a stop; a worker
    # stops between checks (or is terminated after the grace period), never mid-way through Hypothesis.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def stopped() -> bool:
        return bool(conn.poll())  # the parent's stop word, or its end of the pipe closed

    def send(kind: str, payload: Any) -> None:
        conn.send((kind, index, payload))

    try:
        os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = options.hypothesis_dir
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(options.hypothesis_dir)
        from pathlib import Path

        from specproof.conformance._database import SharedDatabaseSilent, default_examples_dir, open_database
        from specproof.conformance._plan import Plan

        try:
            store = open_database(options.db, default_dir=default_examples_dir(Path(options.hypothesis_dir)))
        except SharedDatabaseSilent as exc:  # the parent reached it at start-up: it went away since
            send("lost", exc.lost)
        else:
            base = Plan.create(**options.plan, database=store, storage=options.hypothesis_dir)
            try:
                _rounds(index, options, base, store, send, stopped)
            finally:
                base.close()  # the engines that hold a process or a socket
    except KeyboardInterrupt:
        pass
    except (BrokenPipeError, ConnectionError, EOFError):
        return  # the parent is gone: no one to report to
    except BaseException as exc:  # reported to the parent, which says which worker and why
        try:
            send("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
        except (OSError, EOFError):
            return
    try:
        send("done", None)
    except (OSError, EOFError):
        pass


def _rounds(
    index: int,
    options: CampaignOptions,
    base: Plan,
    store: ExampleStore | None,
    send: Callable[[str, Any], None],
    stopped: Callable[[], bool],
) -> None:
    """A worker's seeded certify rounds on ``base``, each check sent as it ends, until the stop
    word, its ``--rounds``, or its database going away (sent as ``lost``)."""
    from specproof.conformance._certification import Certification
    from specproof.conformance.reports import build_report

    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    r = 0
    while not stopped() and (options.rounds is None or r < options.rounds):
        if options.seed is not None:
            seed = options.seed + index + options.workers * r
        else:
            seed = rng.getrandbits(31)
        send("seed", seed)
        cert = Certification(attrs.evolve(base, seed=seed))
        complete = True
        for item in cert.all_checks():
            if stopped() or (store is not None and store.lost):
                complete = False
                break
            result = cert.run(item)
            send("check", result.to_json())
        send("round" if complete else "partial round", build_report(cert))
        r += 1
        if store is not None and store.lost:
            send("lost", store.lost)
            break


@attrs.define
class _Channel:
    """The parent's side of one worker: its process and its own pipe (None once the pipe ended)."""

    process: Any
    conn: Any


def run_campaign(
    options: CampaignOptions,
    *,
    on_event: Callable[[CampaignState, str, int, Any], None] | None = None,
    grace: float = 20.0,
) -> CampaignState:
    """Run the campaign to its end (time, failures, a lost database, a dead worker, Ctrl-C or SIGTERM)
    and merge its results; every worker is accounted for: finished, or lost with its exit status."""
    state = CampaignState(options=options)
    state.workers = [WorkerState(index=i) for i in range(options.workers)]
    ctx = mp.get_context("spawn")
    channels: list[_Channel] = []
    previous = _on_sigterm()
    stop_at: float | None = None
    watching = _watch_shared(options.db, state)
    try:
        for i in range(options.workers):
            ours, theirs = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_worker, args=(i, options, theirs), daemon=True)
            p.start()
            theirs.close()  # the worker holds the only other end: its death is the pipe's end here
            channels.append(_Channel(p, ours))
        deadline = None if options.duration is None else state.started + options.duration
        while any(c.conn is not None for c in channels):
            now = time.perf_counter()
            if stop_at is None:
                state.stopped = state.stopped or _stop_reason(state, deadline, now)
                if state.stopped:
                    stop_at = now
                    _ask_to_stop(channels)
            elif now - stop_at > grace:
                break  # workers busy in a long check: what they found is saved already
            if not _receive(channels, state, on_event, timeout=0.25) and on_event is not None:
                on_event(state, "tick", -1, None)
    except KeyboardInterrupt as exc:
        state.stopped = "interrupted (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
    finally:
        if watching is not None:
            watching.set()
        if previous is not None:  # a second SIGTERM while the workers stop is not a traceback
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _ask_to_stop(channels)
        _stop_workers(channels, state, stop_at if stop_at is not None else time.perf_counter(), grace, on_event)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if not state.stopped:  # (a failure that came with the workers' last reports still names --max-failures)
        state.stopped = _stop_reason(state, None, time.perf_counter()) or (
            "every worker finished" if options.rounds is None else f"every worker ran its {options.rounds} round(s)"
        )
    return state


SHARED_PING_EVERY = 2.0  # seconds between the parent's PINGs of a shared database


def _watch_shared(db: str | None, state: CampaignState) -> threading.Event | None:
    """For a shared (Redis) database: a thread that PINGs it every ``SHARED_PING_EVERY`` s, each
    PING bounded by the client's timeout, and marks the campaign's database lost when one fails, so
    a frozen or vanished server stops the campaign within seconds even while no worker is calling
    it. The event it returns stops the thread (None: nothing to watch)."""
    from specproof.conformance._database import is_shared, redacted, shared_client, shared_database_failure

    if not db or not is_shared(db):
        return None

    client, done = shared_client(db), threading.Event()

    def watch() -> None:
        while not done.wait(SHARED_PING_EVERY):
            try:
                client.ping()
            except Exception as exc:
                state.lost = state.lost or shared_database_failure(redacted(db), exc)
                return
        client.close()

    threading.Thread(target=watch, name="specproof-watch-shared-db", daemon=True).start()
    return done


def _ask_to_stop(channels: list[_Channel]) -> None:
    for c in channels:
        if c.conn is not None:
            try:
                c.conn.send("stop")
            except (OSError, ValueError):
                pass  # (its worker is gone: the end of its pipe says so)


def _receive(
    channels: list[_Channel],
    state: CampaignState,
    on_event: Callable[[CampaignState, str, int, Any], None] | None,
    *,
    timeout: float,
) -> bool:
    """Take what the workers sent within ``timeout``; a pipe that ended is its worker's end (a
    worker that ended without saying "done" is lost, with its exit status). True when anything came."""
    from multiprocessing.connection import wait

    open_: dict[Any, int] = {c.conn: i for i, c in enumerate(channels) if c.conn is not None}
    if not open_:
        return False
    ready: list[Any] = wait(list(open_), timeout=timeout)
    for conn in ready:
        i = open_[conn]
        try:
            for _ in range(100):  # (then the others' turn, and the stop conditions')
                if not conn.poll():
                    break
                kind, index, payload = conn.recv()
                _absorb(state, kind, index, payload)
                if on_event is not None:
                    on_event(state, kind, index, payload)
        except (EOFError, OSError):  # the worker exited (or died, maybe mid-message)
            _ended(channels[i], state.workers[i], state)
    return bool(ready)


def _ended(channel: _Channel, w: WorkerState, state: CampaignState, note: str = "") -> None:
    """The worker's pipe ended: close it, take its exit status, and account for it."""
    channel.conn.close()
    channel.conn = None
    channel.process.join(timeout=10)
    w.exitcode = channel.process.exitcode
    if not w.done and not w.lost:
        w.lost = note or f"{describe_exit(w.exitcode)} after {w.rounds} round(s)"
        state.stopped = state.stopped or f"worker {w.index} {w.lost}"


def _stop_reason(state: CampaignState, deadline: float | None, now: float) -> str:
    """Why the campaign stops now ("" while it goes on): time, failures, or a lost database."""
    options = state.options
    if deadline is not None and now >= deadline:
        return f"--for {options.duration:g} s elapsed"
    if options.max_failures is not None and state.failed() >= options.max_failures:
        return f"{state.failed()} failing check(s) found (--max-failures)"
    if state.lost:
        return "the shared database went away"
    return ""


def _stop_workers(
    channels: list[_Channel],
    state: CampaignState,
    stop_at: float,
    grace: float,
    on_event: Callable[[CampaignState, str, int, Any], None] | None,
) -> None:
    """Let the workers finish their check (reading what they send, so none blocks on a full pipe),
    terminate, then kill, those still in one after the grace period, and account for each:
    finished, or lost with its exit status."""
    until = max(stop_at + grace, time.perf_counter() + 1.0)  # (the main loop may have used the grace up)
    while any(c.conn is not None for c in channels) and time.perf_counter() < until:
        try:
            _receive(channels, state, on_event, timeout=0.25)
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
            break
    late = [c for c in channels if c.conn is not None]
    sent: dict[int, list[int]] = {id(c): [] for c in late}  # the signals the campaign sent each one
    for c in late:
        c.process.terminate()
        sent[id(c)].append(signal.SIGTERM)
    for c in late:
        c.process.join(timeout=5)
        if c.process.is_alive():
            c.process.kill()
            sent[id(c)].append(signal.SIGKILL)
            c.process.join(timeout=5)
    after = time.perf_counter() - stop_at
    for c in late:
        i = channels.index(c)
        w = state.workers[i]
        try:  # what it sent before the signal (a half-written last report is the pipe's end)
            while c.conn.poll():
                _absorb(state, *c.conn.recv())
        except (EOFError, OSError):
            pass
        _ended(
            c,
            w,
            state,
            note=(
                f"was still in a check after the stop: "
                f"{describe_exit(c.process.exitcode, sent=sent[id(c)], after=after)} after {w.rounds} round(s)"
            ),
        )


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _on_sigterm() -> Any:
    """Handle SIGTERM like Ctrl-C in the parent (main thread only); the handler it replaces, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _absorb(state: CampaignState, kind: str, index: int, payload: Any) -> None:
    worker = state.workers[index]
    if kind == "check":
        state.absorb_check(index, payload)
    elif kind == "round":
        state.absorb_round(index, payload)
    elif kind == "partial round":
        state.absorb_round(index, payload, complete=False)
    elif kind == "seed":
        worker.seed = payload
    elif kind == "lost":
        state.lost = state.lost or payload
    elif kind == "error":
        worker.error = payload
        worker.lost = f"raised {payload.splitlines()[0]} after {worker.rounds} round(s)"
        state.stopped = state.stopped or f"worker {index} failed: {payload.splitlines()[0]}"
    elif kind == "done":
        worker.done = True
