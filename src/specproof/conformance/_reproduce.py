"""Reproduce commands: the one place a failing check's ``specproof certify`` line is built."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specproof.engine.plugin_modules import plugin_directory

if TYPE_CHECKING:  # pragma: no cover
    from specproof.conformance._plan import Plan
    from specproof.conformance._results import CheckResult

__all__ = ["reproduce_command"]

_DIGEST_KEY_ENV = "SPECPROOF_WIRE_DIGEST_KEY"  # (specproof.wire's name: conformance does not import it here)
_DIGEST_KEY = re.compile(r"\$SPECPROOF_WIRE_DIGEST_KEY=([0-9a-f]{32})\b")


def reproduce_command(plan: Plan, result: CheckResult, *, driver_args: Sequence[str] = ()) -> str:
    """The command that runs this check again on the same subjects, profile, seed and tolerances.

    ``driver_args``: the options the check's driver adds (``--replay-session FILE``); with
    them the example database is not needed. Else the command names the database (``--db``)
    whenever the check's failure may have come from it: a saved failure of its own that failed
    again, or saved examples handed to its search before it failed (another worker's or another
    check's failure, a covering example), which the seed alone does not draw. The failing run
    saved its minimal example in the check's namespace, so the command replays it from there.
    """
    specs = plan.specs
    parts = ["specproof", "certify", str(specs.get("subject") or "all")]
    for key in ("drafter", "target", "engine", "oracle"):
        if specs.get(key):
            parts += [f"--{key}", shlex.quote(str(specs[key]))]
    parts += ["--profile", plan.profile.name, "--only", result.invariant]
    if plan.sampling is not None:
        parts += ["--sampling", plan.sampling.describe()]
    if plan.batches:
        parts.append("--batches")
    if plan.decode_state:
        parts.append("--decode-state")
    if plan.trees:
        parts.append("--trees")
    parts += [shlex.quote(a) for a in driver_args]
    if plan.seed is not None:
        parts += ["--seed", str(plan.seed)]
    store = plan.database
    came_back = store is not None and (store.replayed.get(result.nodeid) or store.given_back.get(result.nodeid))
    if came_back and not driver_args:
        parts += ["--db", shlex.quote(store.spec)]  # the failure may need the database: replay it from there
    if plan.tie_tolerance is not None:
        parts += ["--tie-tolerance", repr(plan.tie_tolerance)]
    if plan.atol is not None:
        parts += ["--atol", repr(plan.atol)]
    # a wire state-digest failure names the key its signs were drawn with: the command sets it, so
    # the pasted command compares the same projections (the engine never sees the key)
    keys = {m[1] for v in result.violations for m in _DIGEST_KEY.finditer(str(v.explanation))}
    prefix = [f"{_DIGEST_KEY_ENV}={min(keys)}"] if keys else []
    # a plug-in found in the working directory: the command runs from there
    found = [d for key in ("drafter", "target", "engine") if (d := plugin_directory(specs.get(key)))]
    prefix = ["cd", shlex.quote(found[0]), "&&", *prefix] if found else prefix
    return " ".join(prefix + parts)
