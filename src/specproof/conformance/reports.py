"""Certification reports: ``specproof-report/1`` JSON and its Markdown rendering."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["render_markdown", "write_json_report", "write_markdown_report"]


def _atomic_write(path: str | os.PathLike[str], text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_report(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    _atomic_write(path, json.dumps(report, indent=2, default=str) + "\n")


def render_markdown(report: dict[str, Any]) -> str:
    subj = report["subjects"]
    lines = [f"# specproof certificate — {report['verdict'].upper()}", ""]
    if subj.get("drafter"):
        lines.append(f"- drafter: `{subj['drafter']['spec']}` ({subj['drafter']['name']})")
    if subj.get("target"):
        lines.append(f"- target: `{subj['target']['spec']}` — {subj['target']['description']}")
    for e in subj.get("engines", []):
        lines.append(f"- engine case `{e['case']}`: {e['name']} ({e['kind']})")
    seed = "derandomized" if report.get("derandomized") else f"seed {report.get('seed')}"
    lines += [
        f"- profile `{report['profile']}`, {seed}, tie tolerance {report['tie_tolerance']}",
        f"- specproof {report['specproof_version']}, Hypothesis {report['hypothesis_version']}, "
        f"Python {report['python']}, {report['platform']}",
        f"- {report['seconds']} s",
        "",
        "| invariant | case | status | examples | seconds | detail |",
        "|---|---|---|---:|---:|---|",
    ]
    for r in report["results"]:
        detail = (r.get("detail") or "").replace("|", "\\|")
        lines.append(
            f"| `{r['invariant']}` | {r['case']} | {r['status']} | {r['examples']} | {r['seconds']:.2f} | {detail} |"
        )
    failures = [r for r in report["results"] if r["status"] in ("fail", "error")]
    for r in failures:
        lines += ["", f"## {r['invariant']} ({r['case']}) — {r['status']}", ""]
        for v in r.get("violations") or []:
            lines.append(f"- round {v['round']}: {v['explanation']}")
            if v.get("expected") is not None or v.get("actual") is not None:
                lines.append(f"  - expected `{v['expected']}`, actual `{v['actual']}`")
            if v.get("example"):
                lines += ["", "  ```json", "  " + json.dumps(v["example"], default=str)[:4000], "  ```"]
        if r.get("reproduce"):
            lines += ["", f"Reproduce: `{r['reproduce']}`"]
    return "\n".join(lines) + "\n"


def write_markdown_report(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    _atomic_write(path, render_markdown(report))
