"""Declared expected failures: ``certify --expect-fail ID[=reason]`` and ``--expect-fail-file F``.

As scikit-learn's ``expected_failed_checks`` and array-api-tests' xfails file: a release
gate can accept a known, documented failure without switching the check off. The check
still runs; a failure of it is reported as ``xfail`` (counted apart, not failing the
verdict) and, as pytest's strict xfail, a pass is reported as ``xpass`` and fails the
verdict: the declaration is stale and must go (docs/contract.md, "verdicts").
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from specproof.conformance import _registry as registry
from specproof.contract import UsageError
from specproof.contract.files import FileTooLargeError, read_bounded_text

__all__ = ["load_expected_failures", "parse_expected_failures"]


def _known(invariant_id: str, where: str) -> str:
    try:
        return registry.get(invariant_id).id
    except UsageError as exc:
        detail = str(exc).split(" matches no invariant id", 1)[-1]
        raise UsageError(f"{where}: {invariant_id!r} is not an invariant id{detail}") from None


def parse_expected_failures(items: Iterable[str]) -> dict[str, str]:
    """``ID`` or ``ID=reason`` per item (an exact invariant id; unknown ids are a ``UsageError``)."""
    out: dict[str, str] = {}
    for item in items:
        text = str(item)
        invariant_id, _, reason = text.partition("=")
        invariant_id = invariant_id.strip()
        if not invariant_id:
            raise UsageError(f"--expect-fail {text!r}: give an invariant id, optionally =reason")
        out[_known(invariant_id, f"--expect-fail {text!r}")] = reason.strip() or "declared expected failure"
    return out


def load_expected_failures(path: str | os.PathLike[str]) -> dict[str, str]:
    """A file of ``ID [reason]`` lines; blank lines and ``#`` comments are skipped.

    A line whose id is not an invariant id is a ``UsageError`` naming the file and line.
    """
    try:
        lines = read_bounded_text(path).splitlines()
    except (OSError, UnicodeDecodeError, FileTooLargeError) as exc:
        raise UsageError(f"--expect-fail-file {os.fspath(path)!r}: cannot read it: {exc}") from None
    out: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        invariant_id, _, reason = line.partition(" ")
        if "=" in invariant_id:
            invariant_id, _, first = invariant_id.partition("=")
            reason = f"{first} {reason}".strip()
        where = f"{os.fspath(path)}:{number}"
        out[_known(invariant_id.strip(), where)] = reason.strip() or "declared expected failure"
    return out


def merge(*declared: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for d in declared:
        out.update(d)
    return out
