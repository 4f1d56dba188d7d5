"""specproof.formats: one module per JSON format specproof defines — its id, its schema, and how
it is written and read. Nothing else in specproof spells a format id.

==================  ==============================  ==============================================
module              format                          what
==================  ==============================  ==============================================
``report``          the certify report              ``certify --report``, ``fuzz --report``
``session``         a session history               a failing ``engine.session``, ``--replay-session``
``trace``           a trace (JSON Lines)            ``generate --trace``, ``check-trace``
``golden``          a golden file                   ``check-trace --greedy``, ``bundle export --golden``
``bench``           a bench result                  ``bench --json``
``baseline``        a bench baseline                ``bench --save-baseline``, ``bench --gate``
``generate``        generate's printed JSON         ``generate --json``
``check_trace``     check-trace's printed JSON      ``check-trace --json``
``bundle_inspect``  bundle inspect's printed JSON   ``bundle inspect --json``
``bundle_check``    bundle check's printed JSON     ``bundle check --json``
``invariants``      the registry as JSON            ``invariants --json``
==================  ==============================  ==============================================

Each module has ``ID`` (the format id) and ``FORMAT`` (a ``JsonFormat``: ``problems``,
``validate``, ``dumps``, ``write``, ``read_text``, ``loads``); the schemas themselves are
``specproof/schemas/<name>-<n>.json`` (docs/contract.md, "File formats"). This package sits just
above ``contract`` (it uses ``contract.files`` and ``contract.errors``), below everything else.
"""

from __future__ import annotations

from typing import Final

from specproof.formats import (
    baseline,
    bench,
    bundle_check,
    bundle_inspect,
    check_trace,
    generate,
    golden,
    invariants,
    report,
    session,
    trace,
)
from specproof.formats._format import JsonFormat
from specproof.formats._schema import (
    SchemaProblem,
    describe_value,
    expectation,
    format_path,
    load_schema,
    problems,
    schema_names,
    validate,
)

__all__ = [
    "FORMATS",
    "JsonFormat",
    "SchemaProblem",
    "baseline",
    "bench",
    "bundle_check",
    "bundle_inspect",
    "by_schema",
    "check_trace",
    "describe_value",
    "expectation",
    "format_path",
    "generate",
    "golden",
    "invariants",
    "load_schema",
    "problems",
    "report",
    "schema_names",
    "session",
    "trace",
    "validate",
]

#: every format specproof defines, one per schema file
FORMATS: Final[tuple[JsonFormat, ...]] = tuple(
    m.FORMAT
    for m in (
        report,
        session,
        trace,
        golden,
        bench,
        baseline,
        generate,
        check_trace,
        bundle_inspect,
        bundle_check,
        invariants,
    )
)


def by_schema(name: str) -> JsonFormat:
    """The format whose schema is ``name`` (``report-2``); ``KeyError`` naming the known ones."""
    for fmt in FORMATS:
        if fmt.schema == name:
            return fmt
    raise KeyError(f"no specproof format with schema {name!r} (known: {', '.join(f.schema for f in FORMATS)})")
