"""Certification reports: the report JSON (``specproof.formats.report``), its Markdown certificate and JUnit XML.

The verdict (docs/contract.md, "verdicts"):

- ``fail``: a check failed or could not run (``error``), or a declared expected failure
  passed (``xpass``: strict, as pytest's ``xfail(strict=True)``; the declaration is stale);
- ``pass``: nothing failed, and every subject that was requested had at least one check
  pass on examples that exercised it;
- ``inconclusive``: nothing failed, but nothing ran or some requested subject had no check
  that passed (everything skipped, or only declared failures, ``xfail``), a declared expected
  failure met no check that failed or passed (it was skipped), or a plug-in engine was never seen speculating (no round
  with a draft, no drafted tokens: ``_speculation``) and does not declare ``speculative = False``:
  not a pass;
- ``interrupted``: Ctrl-C; the report holds what finished.

A save the example database did not keep (``database.unsaved``: a read-only directory, a full
disk) makes a ``pass`` or ``inconclusive`` verdict ``fail``, its reason naming the paths: the find
was not kept.

A check named by ``--expect-fail`` that fails is ``xfail``: counted apart, it does not fail
the verdict, and it is no pass: a subject needs a check that passed. An engine check that failed because
the certified drafter failed its own check is a ``consequence`` (``_consequences``): told once,
under the drafter's failure, and counted in the verdict reason.

Every file goes through ``write_text_file``: the path is checked before any work
(``check_output_path``), written atomically, with the usual permissions.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import sys
import time
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Any

import hypothesis
import numpy as np

from specproof._version import __version__
from specproof.conformance._consequences import mark_consequences
from specproof.conformance._registry import REGISTRY
from specproof.conformance._speculation import not_speculative_notes, unspeculated_cases
from specproof.contract.files import check_output_path, write_text_file
from specproof.formats import report as report_format

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._certification import Certification

__all__ = [
    "EXIT_CODES",
    "FORMAT",
    "build_report",
    "check_output_path",
    "failure_groups",
    "render_junit",
    "render_markdown",
    "speculation_lines",
    "write_json_report",
    "write_markdown_report",
    "write_text_file",
]

FORMAT = report_format.ID
EXIT_CODES = {"pass": 0, "fail": 1, "inconclusive": 3, "interrupted": 130}


def _spec_version(spec: str | None) -> str | None:
    """The version of the package a plug-in spec comes from (``mypkg.x:make`` -> mypkg's version)."""
    if not spec:
        return None
    family = spec.split(":", 1)[0]
    if family in ("ngram", "reference", "reference-moe", "trained", "coreml", "exec", "tcp", "model", "combined"):
        return __version__
    if "." not in family and ":" not in spec:
        return __version__
    top = family.split(".")[0]
    if top in ("mlx", "hf"):
        dist = {"mlx": "mlx-lm", "hf": "transformers"}[top]
    else:
        mod = sys.modules.get(top)
        version = getattr(mod, "__version__", None)
        if isinstance(version, str):
            return version
        dist = importlib.metadata.packages_distributions().get(top, [top])[0]
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _verdict(cert: Certification, results: list[dict[str, Any]]) -> tuple[str, str]:
    verdict, why = _verdict_of_results(cert, results)
    unsaved = list(getattr(cert.plan.database, "unsaved", None) or ())
    if unsaved:  # a find the example database did not keep: never a pass (docs/fuzzing.md)
        lost = f"the example database did not keep {len(unsaved)} example(s) (not kept: {'; '.join(unsaved[:3])})"
        verdict = "interrupted" if verdict == "interrupted" else "fail"
        why = f"{why}; {lost}" if why else lost
    return verdict, why


def _verdict_of_results(cert: Certification, results: list[dict[str, Any]]) -> tuple[str, str]:
    if cert.interrupted:
        return "interrupted", "interrupted (Ctrl-C): the report holds the checks that finished"
    if any(r["status"] in ("fail", "error") for r in results):
        return "fail", _consequence_reason(results)
    stale = sorted({r["invariant"] for r in results if r["status"] == "xpass"})
    if stale:
        return "fail", f"declared expected failures passed (strict): {', '.join(stale)}; remove the declarations"
    unapplied = _unapplied_declarations(cert.plan.expected_failures, results)
    if unapplied:
        return "inconclusive", unapplied
    if not results:
        return "inconclusive", "no check ran (the selection is empty for these subjects)"
    by_subject: dict[str, bool] = {}
    for r in results:  # an xfail is no pass: a subject whose checks all failed as declared passed nothing
        by_subject[r["case"]] = by_subject.get(r["case"], False) or r["status"] in ("pass", "excused")
    unchecked = [s for s, ok in by_subject.items() if not ok]
    if unchecked:
        xfailed = {s for s in unchecked if any(r["case"] == s and r["status"] == "xfail" for r in results)}
        named = ", ".join(
            f"{s} (its only non-skip results are declared failures, xfail)" if s in xfailed else s for s in unchecked
        )
        return "inconclusive", f"no check passed on exercised examples for: {named}" + (
            "; a known failure certifies nothing" if xfailed else ""
        )
    never = unspeculated_cases(cert)
    unreached = cert.unreached_paths()
    if never:
        where = "; ".join(
            f"{case}: {seen}" + (f", paths never taken: {', '.join(unreached[case])}" if case in unreached else "")
            for case, seen in never.items()
        )
        return "inconclusive", (
            f"no speculative round was observed, so speculation was not certified ({where}); an engine that "
            "does not speculate says so with `speculative = False` (docs/contract.md, Engines)"
        )
    if unreached:
        where = "; ".join(f"{case}: {', '.join(paths)}" for case, paths in unreached.items())
        return "inconclusive", (
            f"the engine drafts for itself (the suite cannot set its drafter) and never took these rollback "
            f"paths, so nothing checked them: {where}"
        )
    never_related = unreached_relations(results)
    if never_related:
        where = "; ".join(f"{check}: {', '.join(tags)}" for check, tags in never_related.items())
        return "inconclusive", f"request relations never reached, so nothing checked them: {where}"
    return "pass", ""


def unreached_relations(results: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per check that drives requests: the request relations (``request_coverage``) it never reached."""
    out: dict[str, list[str]] = {}
    for r in results:
        never = [tag for tag, n in (r.get("request_coverage") or {}).items() if not n]
        if never and r["status"] not in ("fail", "error"):
            out[r["id"]] = never
    return out


def request_coverage_rows(report: dict[str, Any]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The request-coverage table: its columns (``REQUEST_COVERAGE`` order) and one row of cells per check
    that drives requests ("n/a" where a tag does not apply to that check's subject)."""
    from specproof.strategies import REQUEST_COVERAGE

    rows = [(r["id"], r["request_coverage"]) for r in report["results"] if r.get("request_coverage")]
    if not rows:
        return [], []
    columns = [tag for tag in REQUEST_COVERAGE if any(tag in counts for _, counts in rows)]
    return columns, [(check, [str(counts.get(tag, "n/a")) for tag in columns]) for check, counts in rows]


def request_coverage_lines(report: dict[str, Any]) -> list[str]:
    """The certificate's request-coverage table (markdown), like the path-coverage table: calls or requests
    by their relation to the one before; a relation at 0 makes its check inconclusive."""
    columns, rows = request_coverage_rows(report)
    if not rows:
        return []
    out = ["", "## Request coverage (calls or requests by relation to the one before)", ""]
    out += ["| check | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    out += [f"| {check} | " + " | ".join(cells) + " |" for check, cells in rows]
    never = unreached_relations(list(report["results"]))
    if never:
        out += [
            "",
            "Never reached (inconclusive): " + "; ".join(f"{c}: {', '.join(t)}" for c, t in never.items()) + ".",
        ]
    return out


def _unapplied_declarations(declared: dict[str, str], results: list[dict[str, Any]]) -> str:
    """Why the declared expected failures that applied to no result (their checks skipped, or never
    run) leave the verdict INCONCLUSIVE: empty when every declaration met its check."""
    out = []
    for invariant_id, reason in declared.items():
        own = [r for r in results if r["invariant"] == invariant_id]
        if any(r["status"] in ("xfail", "xpass") for r in own):
            continue
        skipped = [r for r in own if r["status"] == "skip"]
        why = f"skipped: {skipped[0].get('detail') or 'nothing reached it'}" if skipped else "it did not run"
        out.append(f"--expect-fail {invariant_id} ({reason}) names a check that neither failed nor passed ({why})")
    if not out:
        return ""
    return "; ".join(out) + ": the declaration was never tested; remove it or make the check run"


def _consequence_reason(results: list[dict[str, Any]]) -> str:
    """The FAIL reason when engine checks failed only because the drafter did (told once, counted)."""
    followed = [r for r in results if r["status"] == "consequence"]
    if not followed:
        return ""
    causes = sorted({c for r in followed for c in r.get("consequence_of") or ()})
    return (
        f"{len(followed)} engine check(s) failed only as a consequence of {', '.join(causes)} (the drafter's own "
        "failure, reported once); fix the drafter first"
    )


def _capabilities(case: Any, suite: Any) -> dict[str, object]:
    """What the suite observed and drove on an engine case. The built-in engine decodes on the target
    subject with the suite's drafters, compared with fresh copies of it: the suite holds its live
    target, its oracle and its drafts."""
    caps = case.capabilities()
    if case.kind == "builtin":
        target = suite.target.prototype if suite.target is not None else None
        caps.update(
            steps=True,
            live_target=True,
            oracle=True,
            suite_drafts=True,
            state_arrays=callable(getattr(target, "state_arrays", None)),
        )
    return caps


def build_report(cert: Certification) -> dict[str, Any]:
    """The report dict (``specproof.formats.report``) of a finished (or interrupted) certification."""
    plan, suite = cert.plan, cert.plan.suite
    mark_consequences(cert)  # before the results are read: a drafter's failure told once
    declared = not_speculative_notes(cert)
    results = [r.to_json() for r in cert.results.values()]
    verdict, why = _verdict(cert, results)
    checked = {r["case"] for r in results}
    subjects: dict[str, Any] = {"subject": plan.specs.get("subject")}
    entry: dict[str, Any]
    used: list[str] = []
    if suite.drafter is not None:
        entry = {"spec": suite.drafter.spec, "name": suite.drafter.name, "version": _spec_version(suite.drafter.spec)}
        if "drafter" in checked:
            subjects["drafter"] = entry
        else:
            used.append(f"drafter {suite.drafter.spec} (drives the engine cases; not certified)")
    if suite.target is not None:
        entry = {
            "spec": suite.target.spec,
            "name": suite.target.name,
            "description": suite.target.describe(),
            "version": _spec_version(suite.target.spec),
            "tie_tolerance": suite.target.tie_tolerance,
            "atol": suite.target.atol,
        }
        if suite.target.source is not None:  # --oracle: what target.matches-source compared with
            src = suite.target.source
            entry["oracle"] = {"spec": src.spec, "rtol": src.rtol, "router_margin": src.router_margin}
        if "target" in checked:
            subjects["target"] = entry
        else:
            used.append(f"target {suite.target.spec} (the engine cases decode on it; not certified)")
    subjects["engines"] = [
        {
            "case": c.id,
            "name": c.name,
            "kind": c.kind,
            "version": _spec_version(plan.specs.get("engine")) if c.kind == "plugin" else __version__,
            "capabilities": _capabilities(c, suite),
            "notes": [*c.notes, *([declared[c.id]] if c.id in declared else [])],
            # the capacity the examples reached up to, beside the one the engine declares
            "capacity": {"max_context": c.max_context, "tested": c.capacity},
            # a wire engine's traffic and protocol overhead per round (docs/protocol.md)
            **({"wire": c.engine.wire_summary()} if callable(getattr(c.engine, "wire_summary", None)) else {}),
            "tie_tolerance": c.tie_tolerance,
            "atol": c.atol,
        }
        for c in suite.engines
        if c.id in checked
    ]
    subjects["used"] = used
    return {
        "format": FORMAT,
        "specproof_version": __version__,
        "verdict": verdict,
        "verdict_reason": why,
        "subjects": subjects,
        "profile": plan.profile.name,
        "seed": plan.seed,
        "derandomized": plan.seed is None,
        "sampling": plan.sampling.to_json() if plan.sampling is not None else None,
        "only": list(plan.only),
        "expected_failures": [{"invariant": i, "reason": r} for i, r in plan.expected_failures.items()],
        "tie_tolerance": plan.tie_tolerance,
        "atol": plan.atol,
        "hypothesis_version": hypothesis.__version__,
        "numpy_version": np.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "seconds": round(time.perf_counter() - cert.started, 3),
        "path_coverage": cert.path_coverage(),
        "unreached_paths": cert.unreached_paths(),
        # what each speculating engine case's generations say they drafted and accepted (a black box: its stats)
        "speculation": cert.speculation_counts(),
        # the example database: where failures are saved, what was replayed from it, its warnings
        "database": plan.database.describe() if plan.database is not None else None,
        "results": results,
    }


def write_json_report(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    report_format.FORMAT.write(path, report)


def render_markdown(report: dict[str, Any]) -> str:
    """The report as the Markdown certificate: subjects, run, results table, then each section in turn."""
    lines = [f"# specproof certificate — {report['verdict'].upper()}", ""]
    if report.get("verdict_reason"):
        lines += [f"_{report['verdict_reason']}_", ""]
    lines += _subject_lines(report["subjects"])
    seed = "derandomized" if report.get("derandomized") else f"seed {report.get('seed')}"
    lines += [
        f"- profile `{report['profile']}`, {seed}, {_tolerances_in_force(report)}",
        f"- specproof {report['specproof_version']}, Hypothesis {report['hypothesis_version']}, "
        f"Python {report['python']}, {report['platform']}",
        f"- {report['seconds']} s",
        "",
    ]
    lines += _results_table_lines(report["results"])
    declared = report.get("expected_failures") or []
    if declared:
        lines += ["", "## Expected failures (declared with --expect-fail)", ""]
        lines += [f"- `{d['invariant']}`: {d['reason']}" for d in declared]
    lines += _path_coverage_lines(report.get("path_coverage") or {})
    lines += request_coverage_lines(report)
    for case, missing in (report.get("unreached_paths") or {}).items():
        lines += [
            "",
            f"Engine case {case} drafts for itself; paths it never took (not checked): {', '.join(missing)}.",
        ]
    lines += [line.replace("### ", "## ", 1) for line in speculation_lines(report)]
    lines += sampling_lines(report)
    lines += _consequence_lines(report["results"])
    lines += _failure_lines(report["results"])
    return "\n".join(lines) + "\n"


def _subject_lines(subj: dict[str, Any]) -> list[str]:
    """The certificate's list of what was certified: drafter, target, each engine case (with its wire
    traffic when it ran over the protocol) and what was used without being certified."""
    lines = []
    if subj.get("drafter"):
        lines.append(f"- drafter: `{subj['drafter']['spec']}` ({subj['drafter']['name']})")
    if subj.get("target"):
        lines.append(f"- target: `{subj['target']['spec']}` — {subj['target']['description']}")
    for e in subj.get("engines", []):
        lines.append(f"- engine case `{e['case']}`: {e['name']} ({e['kind']})")
        lines += [f"  - note: {n}" for n in e.get("notes") or ()]
        if e.get("wire"):
            w = e["wire"]
            lines.append(
                f"  - wire: {w['generations']} generations, {w['rounds']} rounds, {w['bytes_received']:,} bytes "
                f"received, {w['bytes_sent']:,} sent (state: {w['state']}); protocol overhead per round: "
                + ("n/a (no elapsed_us)" if w["overhead_us_per_round"] is None else f"{w['overhead_us_per_round']} µs")
                + (f"; {w['restarts']} restarts after {w['faults']} faults" if w["faults"] else "")
            )
    for u in subj.get("used") or ():
        lines.append(f"- used, not certified: {u}")
    return lines


def _results_table_lines(results: list[dict[str, Any]]) -> list[str]:
    """One table row per check (``|`` in a detail escaped so it stays in its cell)."""
    lines = [
        "| invariant | case | status | examples | exercised | seconds | detail |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in results:
        detail = (r.get("detail") or "").replace("|", "\\|")
        lines.append(
            f"| `{r['invariant']}` | {r['case']} | {r['status']} | {r['examples']} | {r['exercised']} | "
            f"{r['seconds']:.2f} | {detail} |"
        )
    return lines


def _path_coverage_lines(coverage: dict[str, dict[str, int]]) -> list[str]:
    """The rounds-by-path table per engine case, and the paths no case took; nothing without coverage."""
    if not coverage:
        return []
    paths = [p for p in next(iter(coverage.values())) if p not in ("generations", "completed")]
    lines = ["", "## Path coverage (rounds by path)", ""]
    lines += ["| case | generations | completed | " + " | ".join(paths) + " |"]
    lines += ["|---|---:|---:|" + "---:|" * len(paths)]
    for case, row in coverage.items():
        cells = " | ".join(str(row[p]) for p in paths)
        lines.append(f"| {case} | {row['generations']} | {row['completed']} | {cells} |")
    never = sorted({p for row in coverage.values() for p in paths if not row[p]})
    if never:
        lines += ["", f"Never exercised: {', '.join(never)}."]
    return lines


def _failure_lines(results: list[dict[str, Any]]) -> list[str]:
    """A section per failing (or xfail/xpass) check, with its violations and reproduce line; checks one
    failure of the subject stopped alike share one section (``failure_groups``)."""
    lines: list[str] = []
    shown = [r for r in results if r["status"] in ("fail", "error", "xfail", "xpass")]
    for cause, group in failure_groups(shown):
        if cause is not None:
            lines += ["", f"## One failure stopped {len(group)} checks — {group[0]['status']}", ""]
            lines += [f"- {cause}", f"- checks it stopped: {stopped_checks(group)}"]
            example = _first_example(group)
            if example:
                lines += ["", "  ```json", "  " + json.dumps(example, default=str)[:4000], "  ```"]
            if group[0].get("reproduce"):
                lines += ["", f"Reproduce: `{group[0]['reproduce']}`"]
            continue
        (r,) = group
        lines += ["", f"## {r['invariant']} ({r['case']}) — {r['status']}", ""]
        for v in r.get("violations") or []:
            lines.append(f"- round {v['round']}: {v['explanation']}")
            if v.get("expected") is not None or v.get("actual") is not None:
                lines.append(f"  - expected `{v['expected']}`, actual `{v['actual']}`")
            if v.get("example"):
                lines += ["", "  ```json", "  " + json.dumps(v["example"], default=str)[:4000], "  ```"]
        if r.get("reproduce"):
            lines += ["", f"Reproduce: `{r['reproduce']}`"]
    return lines


def speculation_lines(report: dict[str, Any]) -> list[str]:
    """The certificate's speculation section: per speculating engine case, the drafted and accepted counts its
    generations reported (``stats``), and the acceptance per draft position where the engine reports it."""
    rows = report.get("speculation") or {}
    if not rows:
        return []
    out = ["", "### Speculation (drafted and accepted tokens, from the generations' stats)", ""]
    for case, row in rows.items():
        out.append(f"- {case}: {speculation_summary(row)}")
        positions = row.get("by_position")
        if positions:
            cells = ", ".join(
                f"{i}: {p['accepted']}/{p['attempts']}" + (f" ({p['rate']:.0%})" if p["rate"] is not None else "")
                for i, p in enumerate(positions)
            )
            out.append(f"  - acceptance by draft position: {cells}")
    return out


def speculation_summary(row: dict[str, Any]) -> str:
    """One case's counts in words; a case without stats is told it has none, not "0 drafted"."""
    generations, with_stats = row["generations"], row["with_stats"]
    if not with_stats:
        return (
            f"{generations} generations, no stats (Generation.stats is None): what it drafted is unknown; return "
            "Stats(drafted=..., accepted=...) from generate to show it"
        )
    rate = f" ({row['acceptance']:.1%} accepted)" if row.get("acceptance") is not None else ""
    partial = f" (stats on {with_stats} of {generations} generations)" if with_stats != generations else ""
    return f"{row['drafted']} drafted, {row['accepted']} accepted{rate} over {generations} generations{partial}"


# a check stopped by a failure of the subject (a crash), not by its own judgement: "... raised X: why"
# followed by what the check adds ("(so engine.stop could not be checked)", "[greedy stops at ...]")
# and the known upstream cause the certification names (" — known cause (...): ...")
_RAISED = re.compile(
    r"\braised (?P<cause>.+?)(?: \(so [\w.-]+ could not be checked\))?(?: \[[^\]]*\])?(?P<known> — known cause .*)?$"
)


def _cause_of(result: dict[str, Any]) -> str | None:
    """What stopped this check, when it is a raise every violation names alike (None: its own finding)."""
    if result["status"] == "error":
        return str(result.get("detail") or "") or None
    causes = set()
    for v in result.get("violations") or ():
        found = _RAISED.search(str(v.get("explanation") or ""))
        if found is None:
            return None
        causes.add(found["cause"])
    return causes.pop() if len(causes) == 1 else None


def failure_groups(results: list[dict[str, Any]]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """The failures to print, in order: ``(None, [result])`` for a check's own failure, and
    ``(cause, [results...])`` once for a failure that stopped several checks alike (every request crashed):
    the cause is the first's explanation, less what it says of its own check."""
    by_cause: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        cause = _cause_of(r)
        if cause is not None:
            by_cause.setdefault(cause, []).append(r)
    out: list[tuple[str | None, list[dict[str, Any]]]] = []
    told: set[str] = set()
    for r in results:
        cause = _cause_of(r)
        if cause is None or len(by_cause[cause]) < 2:
            out.append((None, [r]))
        elif cause not in told:
            told.add(cause)
            out.append((_shared_text(by_cause[cause][0]), by_cause[cause]))
    return out


def _shared_text(result: dict[str, Any]) -> str:
    if result["status"] == "error":
        return f"error: {result.get('detail')}"
    text = str(result["violations"][0]["explanation"])
    found = _RAISED.search(text)
    assert found is not None
    return text[: found.start("cause")] + found["cause"] + (found["known"] or "")


def stopped_checks(group: list[dict[str, Any]]) -> str:
    """``engine.lossless, engine.stop (case)``: the checks a shared failure stopped, by case."""
    cases: dict[str, list[str]] = {}
    for r in group:
        cases.setdefault(r["case"], []).append(r["invariant"])
    return "; ".join(f"{', '.join(ids)} ({case})" for case, ids in cases.items())


def _first_example(group: list[dict[str, Any]]) -> Any:
    for r in group:
        for v in r.get("violations") or ():
            if v.get("example"):
                return v["example"]
    return None


SAMPLING_INVARIANTS = frozenset(inv.id for inv in REGISTRY if inv.driver == "sampling")


def sampling_lines(report: dict[str, Any]) -> list[str]:
    """The certificate's sampling section: the parameters, and each sampling check's sample sizes, false-fail
    bound and the smallest deviation it could detect (its notes)."""
    params = report.get("sampling")
    if not params:
        return []
    shown = ",".join(f"{k}={v}" for k, v in params.items() if v is not None)
    out = ["", f"## Sampling ({shown})", "", *_statistical_bound_lines(report)]
    for r in report["results"]:
        if r["invariant"] in SAMPLING_INVARIANTS and r.get("notes"):
            out.append(f"- `{r['invariant']}` ({r['case']}, {r['status']}):")
            out += [f"  - {n}" for n in r["notes"]]
    return out


def _statistical_bound_lines(report: dict[str, Any]) -> list[str]:
    """Each statistical check's false-fail bound, said to be the check's on its engine case and split over
    its configurations (a result's ``statistics``)."""
    out = []
    for r in report["results"]:
        stats = r.get("statistics")
        if stats:
            shares = ", ".join(f"{c['name']} {c['false_fail_bound']:.2g}" for c in stats["configurations"])
            out.append(
                f"- `{r['invariant']}` ({r['case']}): false-fail bound {stats['false_fail_bound']:.2g} for the check "
                f"on this engine case, split over its configurations: {shares}"
            )
    return [*out, ""] if out else []


def _tolerances_in_force(report: dict[str, Any]) -> str:
    """The tie tolerance and atol the comparisons used: the options given, else the target's own
    (``--tie-tolerance``/``--atol`` unset leaves the report's top-level fields null)."""
    subj = report["subjects"]
    holders = [subj.get("target") or {}, *(subj.get("engines") or ())]
    parts = []
    for field, name in (("tie_tolerance", "tie tolerance"), ("atol", "atol")):
        given = report.get(field)
        if given is not None:
            parts.append(f"{name} {given:g} (given)")
            continue
        values = sorted({h[field] for h in holders if h.get(field) is not None})
        parts.append(f"{name} " + ("/".join(f"{v:g}" for v in values) + " (the target's)" if values else "n/a"))
    return ", ".join(parts)


def _consequence_lines(results: list[dict[str, Any]]) -> list[str]:
    """Engine checks that failed only because the drafter did: one line, not one section each."""
    followed = [r for r in results if r["status"] == "consequence"]
    if not followed:
        return []
    causes = sorted({c for r in followed for c in r.get("consequence_of") or ()})
    ids = ", ".join(f"`{r['id']}`" for r in followed)
    return [
        "",
        f"## Consequences of {', '.join(causes)}",
        "",
        f"{len(followed)} engine check(s) failed only because the drafter under certification failed its own "
        f"check (its section below): {ids}.",
    ]


def write_markdown_report(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    write_text_file(path, render_markdown(report))


def render_junit(report: dict[str, Any]) -> str:
    """JUnit XML for CI test-report viewers: one testcase per check."""
    results = report["results"]
    suite = ET.Element(
        "testsuite",
        name="specproof certify",
        tests=str(len(results)),
        failures=str(sum(r["status"] in ("fail", "xpass") for r in results)),
        errors=str(sum(r["status"] == "error" for r in results)),
        skipped=str(sum(r["status"] in ("skip", "xfail", "consequence") for r in results)),
        time=f"{report['seconds']:.3f}",
    )
    for r in results:
        case = ET.SubElement(
            suite, "testcase", classname=f"specproof.{r['case']}", name=r["invariant"], time=f"{r['seconds']:.3f}"
        )
        if r["status"] == "fail":
            text = "\n".join(v["explanation"] for v in r["violations"])
            if r.get("reproduce"):
                text += f"\nreproduce: {r['reproduce']}"
            ET.SubElement(case, "failure", message=r["detail"][:300]).text = text
        elif r["status"] == "error":
            ET.SubElement(case, "error", message=r["detail"][:300])
        elif r["status"] == "xpass":  # strict: a declared expected failure that passed
            ET.SubElement(case, "failure", message=r["detail"][:300])
        elif r["status"] == "consequence":  # told once, under the drafter check that caused it
            ET.SubElement(case, "skipped", message=r["detail"][:300])
        elif r["status"] in ("skip", "xfail"):  # an expected failure is reported as pytest reports xfail
            ET.SubElement(case, "skipped", message=r["detail"][:300])
        ET.SubElement(case, "system-out").text = f"examples {r['examples']}, exercised {r['exercised']}"
    root = ET.Element("testsuites")
    root.append(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
