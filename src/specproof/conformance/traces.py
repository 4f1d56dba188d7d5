"""Traces, golden files (``specproof.formats.trace``, ``.golden``), and checking a trace.

A trace is JSON Lines, one record per line:

- line 1, the header: ``{"format": formats.trace.ID, "vocab_size", "k", "prompt",
  "max_new_tokens", "eos_token_id", "engine", "target"}`` plus optional
  ``"max_context"`` and ``"rollback"``;
- one line per round: ``{"round": i, "base", "draft", "argmax", "accepted", "processed"}``
  (the fields of ``specproof.engine.Step``);
- the final line: ``{"final": true, "tokens", "stop_reason"}``.

A golden file is one JSON object: ``{"format": formats.golden.ID, "target": "...",
"cases": [{"prompt": [...], "max_new_tokens": N, "eos_token_id": null, "tokens": [...]}]}``
(each case may also carry ``"margins"``: the top-2 logit margin of every token, which
lets a divergence on a near-tie be excused).

``check_trace`` judges a trace with every engine invariant of the registry that applies
to a record (a trace has steps, no stats and no live target; with golden tokens or a
target it also has an oracle for the tie-aware lossless verdict); the rest are listed
as ``skipped`` with the reason.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from typing import Literal, TypedDict

import attrs

from specproof.conformance._records import Capabilities, RunRecord
from specproof.conformance._registry import REGISTRY, Invariant, Outcome
from specproof.contract import STOP_REASONS, Generation, Step, Target, Violation
from specproof.contract.errors import InvalidSettingError, SpecproofError
from specproof.contract.files import (
    MAX_JSON_DEPTH,
    FileTooLargeError,
    json_depth_exceeds,
    write_text_file,
)
from specproof.contract.lossless import LosslessVerdict, compare_lossless
from specproof.formats import JsonFormat, SchemaProblem, expectation
from specproof.formats import check_trace as check_trace_format
from specproof.formats import golden as golden_format
from specproof.formats import trace as trace_format

__all__ = [
    "GOLDEN_FORMAT",
    "TRACE_FORMAT",
    "Golden",
    "GoldenCase",
    "GoldenFormatError",
    "InvariantResult",
    "OracleMismatchError",
    "Trace",
    "TraceFormatError",
    "TraceReport",
    "TraceWriteError",
    "check_trace",
    "golden_case",
    "load_golden",
    "read_trace",
    "write_golden",
    "write_trace",
]

TRACE_FORMAT = trace_format.ID
GOLDEN_FORMAT = golden_format.ID


# Every line and golden file is validated with its JSON Schema (specproof/schemas/trace-1.json,
# golden-1.json) first; what a schema cannot say (ids below vocab_size, the rounds' order) is checked here.


class TraceFormatError(SpecproofError, ValueError):
    """A trace file is not a valid trace; the message names the line and the field."""


class GoldenFormatError(SpecproofError, ValueError):
    """A golden file is not valid; the message names the case and the field."""


class TraceWriteError(SpecproofError, OSError):
    """A trace or golden file could not be written (nothing was left half-written)."""


class OracleMismatchError(SpecproofError, ValueError):
    """The greedy oracle given to ``check_trace`` does not fit the trace (vocabulary, context, prompt)."""


# --------------------------------------------------------------------------- records


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _steps(values: Iterable[Step]) -> tuple[Step, ...]:
    return tuple(values)


def _cases(values: Iterable[GoldenCase]) -> tuple[GoldenCase, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class Trace:
    """A parsed trace: the header fields, the rounds as ``Step`` records, the tokens and the stop reason."""

    vocab_size: int
    k: int
    prompt: tuple[int, ...] = attrs.field(converter=_ints)
    max_new_tokens: int
    eos_token_id: int | None
    engine: str
    target: str
    max_context: int | None = None
    rollback: str | None = None
    steps: tuple[Step, ...] = attrs.field(converter=_steps)
    tokens: tuple[int, ...] = attrs.field(converter=_ints)
    stop_reason: str
    source: str | None = attrs.field(default=None, eq=False)

    @property
    def generation(self) -> Generation:
        """The trace as a ``Generation`` (no stats: a trace does not record forwards)."""
        return Generation(tokens=self.tokens, stop_reason=self.stop_reason, steps=self.steps)  # type: ignore[arg-type]

    def header(self) -> dict[str, object]:
        head: dict[str, object] = {
            "format": TRACE_FORMAT,
            "vocab_size": self.vocab_size,
            "k": self.k,
            "prompt": list(self.prompt),
            "max_new_tokens": self.max_new_tokens,
            "eos_token_id": self.eos_token_id,
            "engine": self.engine,
            "target": self.target,
        }
        if self.max_context is not None:
            head["max_context"] = self.max_context
        if self.rollback is not None:
            head["rollback"] = self.rollback
        return head

    def to_lines(self) -> list[str]:
        """The trace as its JSON Lines (without newlines)."""
        lines = [json.dumps(self.header())]
        lines.extend(json.dumps({"round": i, **step.to_json()}) for i, step in enumerate(self.steps))
        lines.append(json.dumps({"final": True, "tokens": list(self.tokens), "stop_reason": self.stop_reason}))
        return lines


# --------------------------------------------------------------------------- field checks


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Fields:
    """Typed reads of one JSON object, with errors that name where it came from."""

    def __init__(self, obj: dict[str, object], where: str, error: type[SpecproofError]) -> None:
        self.obj = obj
        self.where = where
        self.error = error

    def fail(self, message: str) -> SpecproofError:
        return self.error(f"{self.where}: {message}")

    def int_(self, name: str, *, minimum: int) -> int:
        value = self.obj.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(f"field '{name}' must be an int >= {minimum}, got {_describe(value)}")
        return value

    def optional_int(self, name: str, *, minimum: int) -> int | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(f"field '{name}' must be an int >= {minimum} or null, got {_describe(value)}")
        return value

    def str_(self, name: str, *, choices: Sequence[str] | None = None) -> str:
        value = self.obj.get(name)
        if not isinstance(value, str) or (choices is not None and value not in choices):
            want = f"one of {', '.join(repr(c) for c in choices)}" if choices else "a string"
            raise self.fail(f"field '{name}' must be {want}, got {_describe(value)}")
        return value

    def optional_str(self, name: str, *, choices: Sequence[str]) -> str | None:
        return None if self.obj.get(name) is None else self.str_(name, choices=choices)

    def ids(self, name: str, *, vocab_size: int | None, nonempty: bool = False) -> tuple[int, ...]:
        value = self.obj.get(name)
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            raise self.fail(f"field '{name}' must be a list of ints, got {_describe(value)}")
        if nonempty and not value:
            raise self.fail(f"field '{name}' must not be empty")
        for i, v in enumerate(value):
            if v < 0 or (vocab_size is not None and v >= vocab_size):
                bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
                raise self.fail(f"field '{name}' item {i} = {v} is not a token id in {bound}")
        return tuple(value)

    def token(self, name: str, *, vocab_size: int | None) -> int | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or value < 0
            or (vocab_size is not None and value >= vocab_size)
        ):
            bound = f"a token id in [0, {vocab_size})" if vocab_size is not None else "a token id (int >= 0)"
            raise self.fail(f"field '{name}' must be {bound} or null, got {_describe(value)}")
        return value


def _schema_check(obj: dict[str, object], part: str, where: str) -> None:
    """Validate one trace line with the ``trace-1`` schema's ``part`` before any other check."""
    found = trace_format.FORMAT.problems(obj, part=part)
    if found:
        raise TraceFormatError(f"{where}: {_schema_message(found, obj)}")


def _schema_message(found: list[SchemaProblem], obj: dict[str, object]) -> str:
    """The first schema problem of ``obj`` in this module's words: ``missing field 'k'``,
    ``unknown field 'x' (allowed: ...)``, ``field 'k' must be an int >= 0, got -2``..."""
    missing = [str(p.field) for p in found if p.keyword == "required" and len(p.path) == 1]
    if missing:
        names = ", ".join(f"'{f}'" for f in missing)
        return f"missing field{'s' if len(missing) > 1 else ''} {names}"
    unknown = [p for p in found if p.keyword == "additionalProperties" and len(p.path) == 1]
    if unknown:
        names = ", ".join(f"'{p.field}'" for p in unknown)
        allowed = ", ".join(unknown[0].schema.get("properties", {}))
        return f"unknown field{'s' if len(unknown) > 1 else ''} {names} (allowed: {allowed})"
    first = found[0]
    if not first.path:
        return f"expected {expectation(first.schema, integer='an int')}, got {_describe(first.value)}"
    name = first.path[0]
    if len(first.path) == 1:
        if first.keyword == "minItems" and first.schema.get("minItems") == 1:
            return f"field '{name}' must not be empty"
        if first.keyword in ("type", "minimum", "enum", "const"):
            want = expectation(first.schema, integer="an int")
            return f"field '{name}' must be {want}, got {_describe(first.value)}"
    if len(first.path) == 2 and isinstance(first.path[1], int):  # an item of a list of token ids
        if first.keyword == "minimum":
            return f"field '{name}' item {first.path[1]} = {first.value} is not a token id (an int >= 0)"
        return f"field '{name}' must be a list of ints, got {_describe(obj.get(str(name)))}"
    return f"field {first.where!r} {first.text}"


# --------------------------------------------------------------------------- reading


def _parse_lines(lines: Sequence[str], source: str) -> Trace:
    records, n_lines = _json_records(lines, source)
    header = _header(records[0][1], source)
    steps, final = _rounds_and_final(records[1:], source, header["vocab_size"])
    if final is None:
        raise TraceFormatError(
            f'{source} line {n_lines + 1}: missing final line {{"final": true, "tokens": [...], '
            f'"stop_reason": ...}} after line {n_lines} (is the trace truncated?)'
        )
    return Trace(**header, steps=tuple(steps), tokens=final[0], stop_reason=final[1], source=source)


def _json_records(lines: Sequence[str], source: str) -> tuple[list[tuple[int, dict[str, object]]], int]:
    """Each non-trailing line as (line number, JSON object), and how many lines count (trailing blanks cut)."""
    # A trailing newline (or several) is not a record.
    n_lines = len(lines)
    while n_lines and not lines[n_lines - 1].strip():
        n_lines -= 1
    if n_lines == 0:
        raise TraceFormatError(f"{source} line 1: missing header (the file is empty); expected {TRACE_FORMAT}")
    records: list[tuple[int, dict[str, object]]] = []
    for number, line in enumerate(lines[:n_lines], start=1):
        if not line.strip():
            raise TraceFormatError(f"{source} line {number}: empty line (every line is one JSON record)")
        if json_depth_exceeds(line, MAX_JSON_DEPTH):
            raise TraceFormatError(f"{source} line {number}: JSON nested more than {MAX_JSON_DEPTH} deep (the limit)")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{source} line {number}: invalid JSON: {exc}") from None
        except ValueError as exc:  # an integer of more than 4300 digits
            raise TraceFormatError(f"{source} line {number}: invalid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise TraceFormatError(
                f"{source} line {number}: expected a JSON object, got {type(obj).__name__} {_describe(obj)}"
            )
        records.append((number, obj))
    return records, n_lines


class _Header(TypedDict):
    """The header line's fields, as ``Trace`` keyword arguments."""

    vocab_size: int
    k: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    eos_token_id: int | None
    engine: str
    target: str
    max_context: int | None
    rollback: str | None


def _header(head: dict[str, object], source: str) -> _Header:
    """The header line's fields, as ``Trace`` keyword arguments."""
    if "format" not in head:
        kind = "a round record" if "round" in head else "a final record" if "final" in head else "no 'format' field"
        raise TraceFormatError(
            f'{source} line 1: missing header: expected {{"format": "{TRACE_FORMAT}", ...}}, got {kind}'
        )
    if head["format"] != TRACE_FORMAT:
        raise TraceFormatError(
            f"{source} line 1: field 'format' is {_describe(head['format'])}; this reader reads {TRACE_FORMAT!r}"
        )
    _schema_check(head, "header", f"{source} line 1")
    h = _Fields(head, f"{source} line 1", TraceFormatError)
    vocab_size = h.int_("vocab_size", minimum=1)
    return {
        "vocab_size": vocab_size,
        "k": h.int_("k", minimum=0),
        "prompt": h.ids("prompt", vocab_size=vocab_size, nonempty=True),
        "max_new_tokens": h.int_("max_new_tokens", minimum=0),
        "eos_token_id": h.token("eos_token_id", vocab_size=vocab_size),
        "engine": h.str_("engine"),
        "target": h.str_("target"),
        "max_context": h.optional_int("max_context", minimum=1),
        "rollback": h.optional_str("rollback", choices=("checkpoint", "replay")),
    }


def _rounds_and_final(
    records: Sequence[tuple[int, dict[str, object]]], source: str, vocab_size: int
) -> tuple[list[Step], tuple[tuple[int, ...], str] | None]:
    """The round records after the header, in order, and the final line's (tokens, stop reason)."""
    steps: list[Step] = []
    final: tuple[tuple[int, ...], str] | None = None
    for number, obj in records:
        where = f"{source} line {number}"
        if final is not None:
            raise TraceFormatError(f"{where}: a record after the final line (line {number - 1} ended the trace)")
        if "format" in obj:
            raise TraceFormatError(f"{where}: a second header (the header belongs on line 1 only)")
        if "final" in obj:
            _schema_check(obj, "final", where)
            f = _Fields(obj, where, TraceFormatError)
            tokens = f.ids("tokens", vocab_size=vocab_size)
            stop = f.str_("stop_reason", choices=STOP_REASONS)
            final = (tokens, stop)
            continue
        if "round" not in obj:
            fields = ", ".join(f"'{name}'" for name in obj) or "none"
            raise TraceFormatError(
                f"{where}: expected a round record ('round' field) or the final line ('final' field), "
                f"got fields {fields}"
            )
        steps.append(_round_record(obj, where, len(steps), vocab_size))
    return steps, final


def _round_record(obj: dict[str, object], where: str, expected_index: int, vocab_size: int) -> Step:
    _schema_check(obj, "round", where)
    r = _Fields(obj, where, TraceFormatError)
    index = r.int_("round", minimum=0)
    if index != expected_index:
        raise r.fail(f"field 'round' must be {expected_index} (rounds are numbered from 0, in order), got {index}")
    return Step(
        base=r.int_("base", minimum=0),
        draft=r.ids("draft", vocab_size=vocab_size),
        argmax=r.ids("argmax", vocab_size=vocab_size),
        accepted=r.ids("accepted", vocab_size=vocab_size),
        processed=r.int_("processed", minimum=0),
    )


#: the largest trace or golden file read back
MAX_TRACE_BYTES = trace_format.MAX_BYTES


def _read_text(path: str | os.PathLike[str], error: type[SpecproofError], what: str, *, fmt: JsonFormat) -> str:
    try:
        return fmt.read_text(path)
    except FileTooLargeError as exc:
        raise error(f"{os.fspath(path)}: not a {what} file: {exc}") from None
    except FileNotFoundError:
        raise error(f"{os.fspath(path)}: no such {what} file") from None
    except UnicodeDecodeError as exc:
        raise error(f"{os.fspath(path)}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{os.fspath(path)}: cannot read the {what} file: {exc.strerror or exc}") from None


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Parse a trace file; raises ``TraceFormatError`` naming the line and the field."""
    text = _read_text(path, TraceFormatError, "trace", fmt=trace_format.FORMAT)
    return _parse_lines(text.split("\n"), os.fspath(path))


# --------------------------------------------------------------------------- writing


def _write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` through the one atomic writer: never a half-written trace."""
    try:
        write_text_file(path, text)
    except OSError as exc:
        raise TraceWriteError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}") from None


def write_trace(
    path: str | os.PathLike[str],
    generation: Generation,
    *,
    prompt: Sequence[int],
    k: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    vocab_size: int,
    engine: str,
    target: str,
    max_context: int | None = None,
    rollback: str | None = None,
) -> Trace:
    """Write ``generation`` as a trace file (atomically) and return the ``Trace`` written.

    The lines are validated with the reader before anything is written, so every
    trace this writes reads back; a generation without ``steps`` (a black-box
    engine) has no rounds to trace and is refused.
    """
    if generation.steps is None:
        raise InvalidSettingError(
            "write_trace: the generation has no steps (a black-box engine); a trace needs the per-round records"
        )
    try:
        trace = Trace(
            vocab_size=vocab_size,
            k=k,
            prompt=prompt,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id,
            engine=engine,
            target=target,
            max_context=max_context,
            rollback=rollback,
            steps=generation.steps,
            tokens=generation.tokens,
            stop_reason=generation.stop_reason,
            source=os.fspath(path),
        )
    except (TypeError, ValueError) as exc:
        raise InvalidSettingError(f"write_trace: {exc}") from None
    lines = trace.to_lines()
    try:
        _parse_lines(lines, f"{os.fspath(path)} (not written)")
    except TraceFormatError as exc:
        raise InvalidSettingError(f"write_trace: the trace would not be valid: {exc}") from None
    _write_atomically(path, "\n".join(lines) + "\n")
    return trace


# --------------------------------------------------------------------------- golden files


@attrs.frozen(kw_only=True)
class GoldenCase:
    """Plain greedy's tokens for one prompt (and, optionally, each token's top-2 margin)."""

    prompt: tuple[int, ...] = attrs.field(converter=_ints)
    max_new_tokens: int
    eos_token_id: int | None
    tokens: tuple[int, ...] = attrs.field(converter=_ints)
    margins: tuple[float, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(lambda ms: tuple(float(m) for m in ms))
    )

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "prompt": list(self.prompt),
            "max_new_tokens": self.max_new_tokens,
            "eos_token_id": self.eos_token_id,
            "tokens": list(self.tokens),
        }
        if self.margins is not None:
            # JSON has no inf: a one-id vocabulary's margin is written as a large number.
            data["margins"] = [m if math.isfinite(m) else 1e308 for m in self.margins]
        return data


@attrs.frozen(kw_only=True)
class Golden:
    """A golden file: plain greedy outputs of one target."""

    target: str
    cases: tuple[GoldenCase, ...] = attrs.field(converter=_cases)
    source: str | None = attrs.field(default=None, eq=False)

    def case_for(self, prompt: Sequence[int], *, eos_token_id: int | None = None) -> GoldenCase:
        """The case for ``prompt`` (preferring one with the same EOS, then the longest); raises if none."""
        wanted = tuple(int(t) for t in prompt)
        matches = [c for c in self.cases if c.prompt == wanted]
        if not matches:
            shown = list(wanted[:16])
            more = f"... ({len(wanted)} tokens)" if len(wanted) > 16 else ""
            where = self.source or "the golden file"
            raise OracleMismatchError(
                f"{where} has no case for the prompt {shown}{more}; it has {len(self.cases)} case(s)"
            )
        return max(matches, key=lambda c: (c.eos_token_id == eos_token_id, len(c.tokens)))

    def to_json(self) -> dict[str, object]:
        return {"format": GOLDEN_FORMAT, "target": self.target, "cases": [c.to_json() for c in self.cases]}


def load_golden(path: str | os.PathLike[str]) -> Golden:
    """Parse a golden file; raises ``GoldenFormatError`` naming the case and the field."""
    source = os.fspath(path)
    text = _read_text(path, GoldenFormatError, "golden", fmt=golden_format.FORMAT)
    try:
        data = golden_format.FORMAT.loads(text)
    except json.JSONDecodeError as exc:
        raise GoldenFormatError(f"{source}: invalid JSON: {exc}") from None
    except ValueError as exc:
        raise GoldenFormatError(f"{source}: {exc}") from None
    if not isinstance(data, dict):
        raise GoldenFormatError(f"{source}: expected a JSON object, got {type(data).__name__}")
    top = _Fields(data, source, GoldenFormatError)
    if data.get("format") != GOLDEN_FORMAT:
        raise top.fail(f"field 'format' must be {GOLDEN_FORMAT!r}, got {_describe(data.get('format'))}")
    found = golden_format.FORMAT.problems(data)
    if found and len(found[0].path) >= 2 and found[0].path[0] == "cases":  # about one case: name it
        i = found[0].path[1]
        case = [p for p in found if p.path[:2] == ("cases", i)]
        raw = data["cases"][i]  # type: ignore[index]
        if isinstance(raw, dict):
            case = [attrs.evolve(p, path=p.path[2:]) for p in case]
            raise GoldenFormatError(f"{source}: cases[{i}]: {_schema_message(case, raw)}")
        raise GoldenFormatError(f"{source}: cases[{i}]: expected a JSON object, got {_describe(raw)}")
    if found:
        raise top.fail(_schema_message(found, data))
    target = top.str_("target")
    raw_cases = data["cases"]
    assert isinstance(raw_cases, list)
    cases: list[GoldenCase] = []
    for i, raw in enumerate(raw_cases):
        where = f"{source}: cases[{i}]"
        if not isinstance(raw, dict):
            raise GoldenFormatError(f"{where}: expected a JSON object, got {_describe(raw)}")
        c = _Fields(raw, where, GoldenFormatError)
        tokens = c.ids("tokens", vocab_size=None)
        margins = raw.get("margins")
        if margins is not None:
            if (
                not isinstance(margins, list)
                or not all(isinstance(m, (int, float)) and not isinstance(m, bool) and m >= 0 for m in margins)
                or len(margins) != len(tokens)
            ):
                raise c.fail(
                    f"field 'margins' must be a list of {len(tokens)} numbers >= 0 (one per token), "
                    f"got {_describe(margins)}"
                )
        cases.append(
            GoldenCase(
                prompt=c.ids("prompt", vocab_size=None, nonempty=True),
                max_new_tokens=c.int_("max_new_tokens", minimum=0),
                eos_token_id=c.token("eos_token_id", vocab_size=None),
                tokens=tokens,
                margins=margins,
            )
        )
    return Golden(target=target, cases=tuple(cases), source=source)


def write_golden(path: str | os.PathLike[str], golden: Golden) -> None:
    """Write ``golden`` as a golden file (atomically)."""
    _write_atomically(path, golden_format.FORMAT.dumps(golden.to_json()))


def golden_case(
    target: Target, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None
) -> GoldenCase:
    """Run plain greedy on ``target`` and record the case (tokens and margins) for a golden file."""
    from specproof.engine import greedy_with_margins

    gen, margins = greedy_with_margins(target, prompt, max_new_tokens, eos_token_id=eos_token_id)
    return GoldenCase(
        prompt=prompt, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, tokens=gen.tokens, margins=margins
    )


# --------------------------------------------------------------------------- checking a trace

ResultStatus = Literal["pass", "excused", "fail", "inconclusive", "skipped"]


@attrs.frozen(kw_only=True)
class InvariantResult:
    """One invariant's outcome on a trace: ``detail`` is one line for a table."""

    invariant: str
    status: ResultStatus
    detail: str
    violations: tuple[Violation, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "invariant": self.invariant,
            "status": self.status,
            "detail": self.detail,
            "violations": [v.to_json() for v in self.violations],
        }


@attrs.frozen(kw_only=True)
class TraceReport:
    """What ``check_trace`` found: one result per invariant, and the lossless verdict if there was an oracle."""

    source: str | None
    engine: str
    target: str
    rounds: int
    tokens: int
    results: tuple[InvariantResult, ...]
    lossless: LosslessVerdict | None = None

    @property
    def failed(self) -> bool:
        return any(r.status == "fail" for r in self.results)

    @property
    def inconclusive(self) -> bool:
        return any(r.status == "inconclusive" for r in self.results)

    @property
    def passed(self) -> bool:
        """Every invariant passed, was excused (a near-tie) or was not checked for want of an oracle."""
        return not self.failed and not self.inconclusive

    @property
    def exit_code(self) -> int:
        """0 passed, 1 an invariant failed, 2 the oracle could not decide (e.g. a golden file too short)."""
        return 1 if self.failed else 2 if self.inconclusive else 0

    @property
    def violations(self) -> list[Violation]:
        return [v for r in self.results for v in r.violations]

    def result(self, invariant_id: str) -> InvariantResult:
        for r in self.results:
            if r.invariant == invariant_id:
                return r
        raise KeyError(f"no result for {invariant_id!r}; checked: {', '.join(r.invariant for r in self.results)}")

    def to_json(self) -> dict[str, object]:
        return {
            "format": check_trace_format.ID,
            "source": self.source,
            "engine": self.engine,
            "target": self.target,
            "rounds": self.rounds,
            "tokens": self.tokens,
            "passed": self.passed,
            "results": [r.to_json() for r in self.results],
            "lossless": None if self.lossless is None else self.lossless.to_json(),
        }


def _result(inv: Invariant, outcome: Outcome, *, oracle: str | None) -> InvariantResult:
    """One invariant's row: its outcome on the trace's run record, in one line."""
    violations = outcome.violations
    if not violations:
        if not outcome.exercised:
            return InvariantResult(invariant=inv.id, status="skipped", detail=outcome.note)
        status: ResultStatus = "excused" if outcome.excused else "pass"
        detail = outcome.note + (f" ({oracle})" if oracle and "oracle" in inv.needs else "")
        return InvariantResult(invariant=inv.id, status=status, detail=detail)
    first = violations[0]
    where = (
        f"round {first.round}: " if first.round is not None and f"round {first.round}" not in first.explanation else ""
    )
    more = f" (+{len(violations) - 1} more)" if len(violations) > 1 else ""
    suffix = f" ({oracle})" if oracle and "oracle" in inv.needs else ""
    return InvariantResult(
        invariant=inv.id,
        status="fail",
        detail=f"{where}{first.explanation}{more}{suffix}",
        violations=tuple(violations),
    )


# The lossless verdict against an oracle, or why the oracle could not decide (inconclusive).
_Oracle = tuple[LosslessVerdict | None, str]


def _golden_expected(tokens: Sequence[int], trace: Trace) -> tuple[list[int], str | None]:
    """Golden tokens cut as the trace's settings cut them; the stop reason when the cut decides the end."""
    expected = list(tokens[: trace.max_new_tokens])
    stop: str | None = "max_new_tokens" if len(expected) == trace.max_new_tokens else None
    if trace.eos_token_id is not None and trace.eos_token_id in expected:
        expected = expected[: expected.index(trace.eos_token_id) + 1]
        stop = "eos"
    return expected, stop


def _lossless_against_golden(trace: Trace, case: GoldenCase, tie_tolerance: float, name: str) -> _Oracle:
    expected, stop = _golden_expected(case.tokens, trace)
    margins = list(case.margins) if case.margins is not None else None
    actual = list(trace.tokens)
    if stop is None and len(expected) < len(actual):
        # The golden ends before the trace does and not for a reason the trace shares:
        # compare what there is, and say that the rest is unchecked.
        verdict = compare_lossless(
            actual[: len(expected)], expected, expected_margins=margins, tie_tolerance=tie_tolerance
        )
        if verdict.status != "pass":
            return verdict, name
        why = (
            f"its max_new_tokens={case.max_new_tokens}"
            if len(case.tokens) >= case.max_new_tokens
            else f"it stopped at EOS {case.eos_token_id}"
            if case.eos_token_id is not None and case.tokens and case.tokens[-1] == case.eos_token_id
            else "its target's context was full"
        )
        return None, (
            f"the golden case has only {len(case.tokens)} tokens ({why}) and all {len(expected)} match, but the "
            f"trace has {len(actual)}: regenerate the golden with max_new_tokens >= {len(actual)} ({name})"
        )
    verdict = compare_lossless(
        actual,
        expected,
        expected_margins=margins,
        tie_tolerance=tie_tolerance,
        actual_stop_reason=trace.stop_reason,
        expected_stop_reason=stop,
    )
    return verdict, name


def _router_excused(
    verdict: LosslessVerdict, trace: Trace, target: Target, tokens: Sequence[int], router_margin: float
) -> LosslessVerdict:
    """A divergence the oracle's routing explains: the smallest router margin over the rows that led to the
    diverging token (the prompt and greedy's tokens before it, one forward) is below ``router_margin``, so a
    lower-precision engine may have routed one of them otherwise (``engine.row_router_margins``, the rule
    ``bundle check`` applies). Anything else, and every verdict on an oracle without router margins, is kept."""
    from specproof.engine import row_router_margins

    if verdict.status != "fail" or verdict.index is None or verdict.expected is None or verdict.actual is None:
        return verdict
    if router_margin <= 0:
        return verdict
    context = [*trace.prompt, *tokens[: verdict.index]]
    target.reset()
    target.forward(context)
    router = float(row_router_margins(target, len(context)).min())
    if not router < router_margin:
        return verdict
    return attrs.evolve(
        verdict,
        status="excused",
        explanation=f"token {verdict.index} differs (greedy {verdict.expected}, engine {verdict.actual}) after a "
        f"router near-tie: the oracle's smallest router margin over the {len(context)} rows before it is "
        f"{router:.3g} < router margin {router_margin:.3g}; the tokens after it cannot be compared",
    )


def _check_oracle_options(golden: bool, target: Target | None, router_margin: float) -> None:
    if golden and target is not None:
        raise InvalidSettingError("check_trace: give greedy_tokens or target, not both")
    if isinstance(router_margin, bool) or not isinstance(router_margin, (int, float)) or not router_margin >= 0:
        raise InvalidSettingError(f"check_trace: router_margin={router_margin!r} must be a number >= 0")
    if router_margin and target is None:
        raise InvalidSettingError("check_trace: router_margin needs a target oracle (its router margins)")


def _lossless_against_target(
    trace: Trace, target: Target, tie_tolerance: float, name: str | None, router_margin: float = 0.0
) -> _Oracle:
    from specproof.engine import greedy_with_margins
    from specproof.engine.conventions import component_name

    name = name or component_name(target)
    if target.vocab_size != trace.vocab_size:
        raise OracleMismatchError(
            f"target {name} has vocab_size={target.vocab_size} but the trace was recorded with "
            f"vocab_size={trace.vocab_size}: it is not the same model"
        )
    if trace.max_context is not None and target.max_context != trace.max_context:
        raise OracleMismatchError(
            f"target {name} has max_context={target.max_context} but the trace was recorded with "
            f"max_context={trace.max_context}: where generation stops would differ"
        )
    gen, margins = greedy_with_margins(target, trace.prompt, trace.max_new_tokens, eos_token_id=trace.eos_token_id)
    verdict = compare_lossless(
        list(trace.tokens),
        list(gen.tokens),
        expected_margins=margins,
        tie_tolerance=tie_tolerance,
        actual_stop_reason=trace.stop_reason,
        expected_stop_reason=gen.stop_reason,
    )
    return _router_excused(verdict, trace, target, gen.tokens, router_margin), f"plain greedy on {name}"


def check_trace(
    trace: Trace,
    *,
    greedy_tokens: Sequence[int] | GoldenCase | Golden | None = None,
    target: Target | None = None,
    tie_tolerance: float = 0.0,
    oracle_name: str | None = None,
    router_margin: float = 0.0,
) -> TraceReport:
    """Check a trace: every engine invariant that applies to a record, losslessness when an oracle is given.

    The oracle is either ``greedy_tokens`` — plain greedy's tokens for the trace's
    prompt (a prefix at least as long as the trace's output, or ending where the
    trace's EOS / ``max_new_tokens`` end it), a ``GoldenCase``, or a ``Golden`` file
    (the case whose prompt equals the trace's is used) — or a ``target`` on which plain greedy is run
    (with margins, for the tie-aware verdict; a divergence after a row the target routes by less than
    ``router_margin`` is excused too: ``_router_excused``). Without an oracle
    the invariants needing an oracle are ``skipped``. An oracle that does not fit the trace raises
    ``OracleMismatchError``. ``oracle_name`` names the oracle in the report (a target
    spec, a file name).
    """
    _check_oracle_options(greedy_tokens is not None, target, router_margin)
    steps = trace.steps
    oracle: _Oracle | None = None
    if target is not None:
        oracle = _lossless_against_target(trace, target, tie_tolerance, oracle_name, router_margin)
    elif greedy_tokens is not None:
        if isinstance(greedy_tokens, Golden):
            case = greedy_tokens.case_for(trace.prompt, eos_token_id=trace.eos_token_id)
            name = oracle_name or f"golden {greedy_tokens.source or greedy_tokens.target}"
        elif isinstance(greedy_tokens, GoldenCase):
            case, name = greedy_tokens, oracle_name or "the golden case"
            if case.prompt != trace.prompt:
                raise OracleMismatchError("check_trace: the golden case's prompt is not the trace's prompt")
        else:
            if isinstance(greedy_tokens, (str, bytes)):
                raise InvalidSettingError("check_trace: greedy_tokens must be token ids, not a string")
            toks = [int(t) for t in greedy_tokens]
            case = GoldenCase(prompt=trace.prompt, max_new_tokens=len(toks), eos_token_id=None, tokens=toks)
            name = oracle_name or "the given greedy tokens"
        oracle = _lossless_against_golden(trace, case, tie_tolerance, name)
    verdict = oracle[0] if oracle is not None else None
    capabilities = Capabilities(
        has={"steps", "oracle"} if verdict is not None else {"steps"},
        why_not={
            "oracle": "no greedy oracle given (golden tokens or a target), so it was not checked",
            "stats": "a trace records no stats",
            "target": "a trace has no live target to read the state of",
            "builtin": "a trace is a record, not a decoder to drive",
            "sessions": "a trace is one generation",
        },
    )
    record = RunRecord(
        generation=Generation(tokens=trace.tokens, stop_reason=trace.stop_reason, steps=steps),  # type: ignore[arg-type]
        prompt=trace.prompt,
        k=trace.k,
        max_new_tokens=trace.max_new_tokens,
        eos=trace.eos_token_id,
        max_context=trace.max_context,
        rollback=trace.rollback,
        lossless=verdict,
        capabilities=capabilities,
    )
    results: list[InvariantResult] = []
    for inv in REGISTRY:
        if inv.on_record is None:
            continue
        if oracle is not None and verdict is None and "oracle" in inv.needs:
            results.append(InvariantResult(invariant=inv.id, status="inconclusive", detail=oracle[1]))
            continue
        results.append(_result(inv, inv.judge_record(record), oracle=oracle[1] if oracle else None))
    return TraceReport(
        source=trace.source,
        engine=trace.engine,
        target=trace.target,
        rounds=len(steps),
        tokens=len(trace.tokens),
        results=tuple(results),
        lossless=verdict,
    )
