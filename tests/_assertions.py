"""Assertion helpers shared by the tests: a report read the same way everywhere, and failures
that explain themselves (the result's status, detail and first violation, not ``False is not True``).

``report`` is what ``certify()`` returns (a ``Report``) or its JSON document (a dict).
"""

from __future__ import annotations

from typing import Any


def report_json(report: Any) -> dict[str, Any]:
    """The report document, whether ``report`` is a ``Report`` or already its dict."""
    return report.to_json() if hasattr(report, "to_json") else report


def by_invariant(report: Any) -> dict[str, dict[str, Any]]:
    """A report's results keyed by invariant id (the last result of an id wins: one case per run)."""
    return {r["invariant"]: r for r in report_json(report)["results"]}


def explain(result: dict[str, Any]) -> str:
    """One line saying what a result was and why: status, counts, detail, the first violation."""
    violations = result.get("violations") or []
    first = violations[0].get("explanation", violations[0]) if violations else ""
    return (
        f"{result['id']}: {result['status']} ({result['examples']} examples, {result['exercised']} exercised)"
        f"{' - ' + result['detail'] if result.get('detail') else ''}{' - ' + str(first)[:300] if first else ''}"
    )


def assert_status(report: Any, invariant: str, *statuses: str) -> dict[str, Any]:
    """The result of ``invariant``, asserted to have one of ``statuses``; the message explains it."""
    results = by_invariant(report)
    assert invariant in results, f"{invariant} did not run; the report has {sorted(results)}"
    result = results[invariant]
    assert result["status"] in statuses, f"expected {' or '.join(statuses)}: {explain(result)}"
    return result
