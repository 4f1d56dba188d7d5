"""Declared expected failures: ``certify --expect-fail ID[=reason]`` and ``--expect-fail-file F``.

As scikit-learn's ``expected_failed_checks`` and array-api-tests' xfails file: a release
gate can accept a known, documented failure without switching the check off. The check
still runs; a failure of it is reported as ``xfail`` (counted apart, not failing the
verdict) and, as pytest's strict xfail, a pass is reported as ``xpass`` and fails the
verdict: the declaration is stale and must go (docs/contract.md, "verdicts").

A declaration means one thing: an id declared twice (on the command line, in the file, or
both) is a ``UsageError`` naming both places, and a file that is not a regular file (a FIFO,
a device) is refused before it is opened. A declaration for a check the plan does not run is
refused by ``Plan.create``; one for a check that ran but was skipped makes the verdict
INCONCLUSIVE (``reports``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import attrs

from specproof.conformance import _registry as registry
from specproof.contract import UsageError
from specproof.contract.files import FileTooLargeError, NotRegularFileError, read_bounded_text

__all__ = ["declared_failures", "load_expected_failures", "parse_expected_failures"]

_DEFAULT_REASON = "declared expected failure"


@attrs.frozen
class _Declaration:
    invariant: str  # the registry's id
    reason: str
    where: str  # "--expect-fail 'ID=reason'" or "FILE:LINE"


def _known(invariant_id: str, where: str) -> str:
    try:
        return registry.get(invariant_id).id
    except UsageError as exc:
        detail = str(exc).split(" matches no invariant id", 1)[-1]
        raise UsageError(f"{where}: {invariant_id!r} is not an invariant id{detail}") from None


def _from_options(items: Iterable[str]) -> list[_Declaration]:
    out: list[_Declaration] = []
    for item in items:
        text = str(item)
        invariant_id, _, reason = text.partition("=")
        invariant_id = invariant_id.strip()
        where = f"--expect-fail {text!r}"
        if not invariant_id:
            raise UsageError(f"{where}: give an invariant id, optionally =reason")
        out.append(_Declaration(_known(invariant_id, where), reason.strip() or _DEFAULT_REASON, where))
    return out


def _from_file(path: str | os.PathLike[str]) -> list[_Declaration]:
    name = os.fspath(path)
    try:  # (read_bounded_text refuses a FIFO or a device before reading: opening one never blocks)
        lines = read_bounded_text(path).splitlines()
    except NotRegularFileError as exc:
        raise UsageError(f"--expect-fail-file {name!r}: not a regular file ({exc.kind}); give a text file") from None
    except (OSError, UnicodeDecodeError, FileTooLargeError) as exc:
        raise UsageError(f"--expect-fail-file {name!r}: cannot read it: {exc}") from None
    out: list[_Declaration] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        invariant_id, _, reason = line.partition(" ")
        if "=" in invariant_id:
            invariant_id, _, first = invariant_id.partition("=")
            reason = f"{first} {reason}".strip()
        where = f"{name}:{number}"
        out.append(_Declaration(_known(invariant_id.strip(), where), reason.strip() or _DEFAULT_REASON, where))
    return out


def _collect(declarations: Iterable[_Declaration]) -> dict[str, str]:
    """Invariant id -> reason; an id declared twice is a ``UsageError`` naming both places."""
    seen: dict[str, _Declaration] = {}
    for d in declarations:
        first = seen.get(d.invariant)
        if first is not None:
            raise UsageError(
                f"{d.invariant} is declared an expected failure twice: {first.where} and {d.where}; keep one"
            )
        seen[d.invariant] = d
    return {i: d.reason for i, d in seen.items()}


def parse_expected_failures(items: Iterable[str]) -> dict[str, str]:
    """``ID`` or ``ID=reason`` per item (an exact invariant id; unknown or repeated ids are a ``UsageError``)."""
    return _collect(_from_options(items))


def load_expected_failures(path: str | os.PathLike[str]) -> dict[str, str]:
    """A file of ``ID [reason]`` lines; blank lines and ``#`` comments are skipped.

    A line whose id is not an invariant id, or repeats an earlier line's, is a ``UsageError``
    naming the file and line(s); so is a path that is not a regular file (checked before opening).
    """
    return _collect(_from_file(path))


def declared_failures(path: str | os.PathLike[str] | None, items: Iterable[str]) -> dict[str, str]:
    """The file's declarations and the options', together: an id in both is a ``UsageError`` naming both."""
    return _collect([*(_from_file(path) if path else ()), *_from_options(items)])
