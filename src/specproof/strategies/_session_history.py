"""The session request history (``specproof.formats.session``): ``SessionRequest``, ``SessionHistory`` and their file.

A session machine failure carries the whole request history; ``SessionHistory`` saves it
as a JSON file (bounded reading, errors naming the file and the
field or line: docs/contract.md, sessions), which ``replay_session`` replays. This module
only reads, validates and writes the record; running it is ``_session_runner``'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from numbers import Integral
from pathlib import Path

import attrs

from specproof.contract import DecodeParams, UsageError
from specproof.contract.files import FileTooLargeError
from specproof.formats import SchemaProblem
from specproof.formats import session as session_format
from specproof.strategies._rounds import PlannedRound, RoundPlan

__all__ = [
    "DRAFTER_CHOICES",
    "MAX_NEW_TOKENS",
    "MAX_PLAN_ROUNDS",
    "MAX_PROMPT_TOKENS",
    "MAX_REQUESTS",
    "REQUEST_KINDS",
    "SESSION_FORMAT",
    "SessionFileError",
    "SessionHistory",
    "SessionRequest",
]

SESSION_FORMAT = session_format.ID
SCHEMA_FILE = session_format.SCHEMA_FILE

# Request kinds, in the order the machine's rules are listed. "reset" carries no prompt.
REQUEST_KINDS: tuple[str, ...] = ("new_prompt", "regenerate", "edit", "multi_turn", "earlier_prefix", "reset")
# A request's drafter: a ScriptedDrafter following its plan, or the engine's own put back.
DRAFTER_CHOICES: tuple[str, ...] = ("scripted", "engine")


class SessionFileError(UsageError):
    """A session history (file or JSON object) is malformed; the message names the field."""


# What one history may hold (docs/contract.md, sessions), checked before the schema looks at it: a
# well-formed history is read and replayed in bounded time (the schema reads about 50k ids a second).
# The session machine records far less: requests, the profile's stateful steps; every prompt and
# budget within the engine's max_context (checked against the engine too: ``check_fits``).
MAX_REQUESTS = 10_000
MAX_PROMPT_TOKENS = 1 << 17  # one prompt's tokens (twice the release profile's largest context)
MAX_HISTORY_TOKENS = 1 << 18  # every prompt's tokens together
MAX_NEW_TOKENS = 1 << 20  # one request's budget
MAX_PLAN_ROUNDS = 1 << 12  # one scripted plan's rounds
_LIMITS = "docs/contract.md, sessions"


def _check_size(obj: Mapping[str, object], source: str) -> None:
    """The counts that bound the reading, before the schema walks the history (a 5M-token prompt or a
    million requests is refused at once, naming the field and the limit)."""

    def too_many(where: str, what: str, count: int, limit: int) -> SessionFileError:
        return _field_error(source, where, f"has {count} {what}, more than a session history may hold "
                            f"({limit}; {_LIMITS})")  # fmt: skip

    requests = obj.get("requests")
    if not isinstance(requests, list):
        return  # (the schema names it)
    if len(requests) > MAX_REQUESTS:
        raise too_many("requests", "requests", len(requests), MAX_REQUESTS)
    total = 0
    for i, request in enumerate(requests):
        if not isinstance(request, Mapping):
            continue
        prompt, plan, budget = request.get("prompt"), request.get("plan"), request.get("max_new_tokens")
        if isinstance(prompt, list):
            if len(prompt) > MAX_PROMPT_TOKENS:
                raise too_many(f"requests[{i}].prompt", "tokens", len(prompt), MAX_PROMPT_TOKENS)
            total += len(prompt)
            if total > MAX_HISTORY_TOKENS:
                raise too_many(f"requests[:{i + 1}] (their prompts)", "tokens", total, MAX_HISTORY_TOKENS)
        if isinstance(plan, list) and len(plan) > MAX_PLAN_ROUNDS:
            raise too_many(f"requests[{i}].plan", "rounds", len(plan), MAX_PLAN_ROUNDS)
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > MAX_NEW_TOKENS:
            more = f"= {budget} is more than a request may ask ({MAX_NEW_TOKENS}; {_LIMITS})"
            raise _field_error(source, f"requests[{i}].max_new_tokens", more)


# --------------------------------------------------------------------------- the history record


def _field_error(source: str, where: str, problem: str) -> SessionFileError:
    return SessionFileError(f"{source}: {where} {problem}")


def _schema_error(source: str, found: list[SchemaProblem], obj: Mapping[str, object]) -> SessionFileError:
    """The first schema problem (of ``session-1``) as the error naming the field; a count of the rest."""
    first = found[0]
    text = str(first)
    if first.keyword == "required" and len(first.path) == 3:  # requests[i].prompt: say why it is needed
        kind = obj["requests"][first.path[1]].get("kind")  # type: ignore[index]
        text = f"{first.where} is missing (a {kind} request needs it)"
    more = f" (and {len(found) - 1} more problem{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
    return SessionFileError(f"{source}: {text}{more} (schema: {SCHEMA_FILE})")


def _int_field(value: object, *, source: str, where: str, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise _field_error(source, where, f"must be an integer, got {value!r}")
    number = int(value)
    if number < minimum or (maximum is not None and number >= maximum):
        span = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum})"
        raise _field_error(source, where, f"= {number} must be {span}")
    return number


@attrs.frozen(kw_only=True)
class SessionRequest:
    """One request of a session: ``kind`` (``REQUEST_KINDS``), what was asked, and the scripted plan.

    ``plan`` is ``((draft_length, correct), ...)`` when the machine installed a
    ``ScriptedDrafter`` following that plan; ``drafter`` is ``"scripted"``, ``"engine"``
    (the engine's own drafter, put back) or None (the engine takes no drafter).
    ``feature_layers`` (optional) makes the installed drafter a feature drafter declaring
    those layers: the engine hands it the target's features and every proposal's rows are
    judged against the feature oracle (``FeatureJudge``); None: a plain drafter.
    ``decode`` (optional, drawn with ``--decode-state``) is the request's ``DecodeParams``, passed to
    ``generate`` as ``decode=`` and judged against plain decoding with them; None: plain greedy.
    ``note`` says in words how the prompt was made (for people; replay ignores it).
    A ``reset`` request has an empty prompt and ``max_new_tokens == 0``.
    """

    kind: str
    prompt: tuple[int, ...] = ()
    max_new_tokens: int = 0
    eos_token_id: int | None = None
    drafter: str | None = None
    plan: tuple[tuple[int, int], ...] | None = None
    feature_layers: tuple[int, ...] | None = None
    decode: DecodeParams | None = None
    note: str = ""

    def round_plan(self) -> RoundPlan | None:
        if self.plan is None:
            return None
        return RoundPlan(tuple(PlannedRound(length, correct) for length, correct in self.plan))

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind}
        if self.kind != "reset":
            out.update(
                prompt=list(self.prompt),
                max_new_tokens=self.max_new_tokens,
                eos_token_id=self.eos_token_id,
                drafter=self.drafter,
                plan=None if self.plan is None else [list(r) for r in self.plan],
            )
            if self.feature_layers is not None:  # absent otherwise: a history without features reads as before
                out["feature_layers"] = list(self.feature_layers)
            if self.decode is not None:  # absent otherwise: a history without decode parameters is unchanged
                out["decode"] = self.decode.to_json()
        if self.note:
            out["note"] = self.note
        return out

    def describe(self) -> str:
        """One line: ``edit(prompt=[...], max_new_tokens=8, eos_token_id=None, plan=[...]) -- note``."""
        if self.kind == "reset":
            return "reset()"
        plan = "" if self.plan is None else ", plan=" + self.round_plan().describe()  # type: ignore[union-attr]
        drafter = "" if self.drafter in (None, "scripted") else f", drafter={self.drafter}"
        feats = "" if self.feature_layers is None else f", feature_layers={list(self.feature_layers)}"
        decode = "" if self.decode is None else f", decode={self.decode.to_json()}"
        text = (
            f"{self.kind}(prompt={_fmt(self.prompt)}, max_new_tokens={self.max_new_tokens}, "
            f"eos_token_id={self.eos_token_id}{drafter}{plan}{feats}{decode})"
        )
        return f"{text} -- {self.note}" if self.note else text

    @classmethod
    def from_json(cls, obj: object, *, source: str, where: str, vocab_size: int | None) -> SessionRequest:
        """Build from a request object already valid under the ``session-1`` schema; the checks the
        schema cannot make (ids below ``vocab_size``, the plan against the drafter) raise here."""
        if not isinstance(obj, Mapping):
            raise _field_error(source, where, f"must be a JSON object, got {type(obj).__name__}")
        kind = obj["kind"]
        note = obj.get("note", "")
        if kind == "reset":
            return cls(kind="reset", note=note)
        tokens = tuple(
            _int_field(t, source=source, where=f"{where}.prompt[{i}]", maximum=vocab_size)
            for i, t in enumerate(obj["prompt"])
        )
        budget = _int_field(obj["max_new_tokens"], source=source, where=f"{where}.max_new_tokens")
        eos = obj.get("eos_token_id")
        if eos is not None:
            eos = _int_field(eos, source=source, where=f"{where}.eos_token_id", maximum=vocab_size)
        drafter = obj.get("drafter")
        raw_plan = obj.get("plan")
        plan: tuple[tuple[int, int], ...] | None = None
        if raw_plan is not None:
            if drafter != "scripted":
                raise _field_error(source, f"{where}.plan", f"is given but drafter is {drafter!r}, not 'scripted'")
            rounds = []
            for r, (length, correct) in enumerate(raw_plan):
                if correct > length:
                    raise _field_error(source, f"{where}.plan[{r}]", f"has correct={correct} > draft_length={length}")
                rounds.append((int(length), int(correct)))
            plan = tuple(rounds)
        elif drafter == "scripted":
            raise _field_error(source, f"{where}.plan", "is missing: a scripted request needs its plan")
        raw_layers = obj.get("feature_layers")
        layers: tuple[int, ...] | None = None
        if raw_layers is not None:
            if drafter is None:
                raise _field_error(
                    source, f"{where}.feature_layers", "is given but the request installs no drafter (drafter is null)"
                )
            layers = tuple(int(x) for x in raw_layers)
            if len(set(layers)) != len(layers):
                raise _field_error(source, f"{where}.feature_layers", f"= {list(layers)} names a layer twice")
        return cls(
            kind=kind,
            prompt=tokens,
            max_new_tokens=budget,
            eos_token_id=eos,
            drafter=drafter,
            plan=plan,
            feature_layers=layers,
            decode=_decode_field(obj.get("decode"), source=source, where=f"{where}.decode", vocab_size=vocab_size),
            note=note,
        )


def _decode_field(raw: object, *, source: str, where: str, vocab_size: int | None) -> DecodeParams | None:
    """A request's ``decode`` object (``DecodeParams.to_json()``, its shape checked by the schema) as the
    parameters, their values checked by ``DecodeParams`` itself (and ids below ``vocab_size``)."""
    if raw is None:
        return None
    try:
        params = DecodeParams.from_json(raw)  # type: ignore[arg-type]
        if vocab_size is not None:
            params.check_vocab(vocab_size)
    except (ValueError, TypeError) as err:  # InvalidSettingError, TokenRangeError
        raise _field_error(source, where, f"is not valid decode parameters: {err}") from None
    return params


@attrs.frozen(kw_only=True)
class SessionHistory:
    """Every request of a session, in order, and which one failed: what ``replay_session`` replays.

    JSON (``specproof.formats.session``)::

        {"format": formats.session.ID, "vocab_size": 64, "engine": "mypkg.engine:make",
         "failing_request": 3, "requests": [{"kind": "new_prompt", "prompt": [...],
         "max_new_tokens": 8, "eos_token_id": null, "drafter": "scripted",
         "plan": [[4, 4], [4, 1]], "note": "..."}, ...]}

    ``engine`` (optional) names the plug-in the history was recorded on; ``failing_request``
    (optional) the index of the request that failed. A request that installed a feature drafter
    also has ``"feature_layers": [1, 3]``, and one with decode parameters ``"decode": {...}``
    (``DecodeParams.to_json()``; both added compatibly: absent otherwise, and optional to read).
    """

    requests: tuple[SessionRequest, ...]
    vocab_size: int | None = None
    engine: str | None = None
    failing_request: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "format": SESSION_FORMAT,
            "vocab_size": self.vocab_size,
            "engine": self.engine,
            "failing_request": self.failing_request,
            "requests": [r.to_json() for r in self.requests],
        }

    def describe(self) -> str:
        """The history, one numbered request per line (the failing one marked)."""
        lines = []
        for i, req in enumerate(self.requests):
            mark = "  <-- fails" if i == self.failing_request else ""
            lines.append(f"  [{i}] {req.describe()}{mark}")
        return "\n".join(lines)

    @classmethod
    def from_json(cls, obj: object, *, source: str = "<session history>") -> SessionHistory:
        """Validate and build; a ``SessionFileError`` names the offending field (``requests[2].prompt[5]``)."""
        if not isinstance(obj, Mapping):
            raise SessionFileError(f"{source}: a session history is a JSON object, got {type(obj).__name__}")
        _check_size(obj, source)
        found = session_format.FORMAT.problems(dict(obj))
        if found:
            raise _schema_error(source, found, obj)
        vocab = obj.get("vocab_size")
        engine = obj.get("engine")
        raw = obj["requests"]
        requests = tuple(
            SessionRequest.from_json(r, source=source, where=f"requests[{i}]", vocab_size=vocab)
            for i, r in enumerate(raw)
        )
        failing = obj.get("failing_request")
        if failing is not None:
            failing = _int_field(failing, source=source, where="failing_request", maximum=len(requests))
        return cls(requests=requests, vocab_size=vocab, engine=engine, failing_request=failing)

    def check_fits(self, *, engine: str, max_context: int | None, vocab_size: int | None, source: str) -> None:
        """The history can be replayed on this engine: every request's prompt and ``max_new_tokens``
        fit its ``max_context`` (as the session machine records them) and every id is below its
        ``vocab_size``; else a ``SessionFileError`` (a usage error, before any work) naming the request."""
        for i, req in enumerate(self.requests):
            if req.kind == "reset":
                continue
            ids = [*req.prompt, *(() if req.eos_token_id is None else (req.eos_token_id,))]
            if vocab_size is not None and ids and max(ids) >= vocab_size:
                raise SessionFileError(
                    f"{source}: requests[{i}] has token id {max(ids)}, but engine {engine} has vocab_size={vocab_size}"
                )
            need = len(req.prompt) + req.max_new_tokens
            if max_context is not None and need > max_context:
                raise SessionFileError(
                    f"{source}: requests[{i}] does not fit engine {engine}: its prompt of {len(req.prompt)} tokens "
                    f"and max_new_tokens={req.max_new_tokens} need a context of {need} tokens, and the engine's "
                    f"max_context is {max_context}"
                )

    @classmethod
    def from_example(cls, example: Mapping[str, object], *, vocab_size: int | None = None) -> SessionHistory:
        """From a ``SessionFailure``'s ``example`` (``{"history": [...], "failing_request": i}``)."""
        obj: dict[str, object] = {
            "format": SESSION_FORMAT,
            "vocab_size": example.get("vocab_size", vocab_size),
            "engine": example.get("engine"),
            "failing_request": example.get("failing_request"),
            "requests": example.get("history"),
        }
        return cls.from_json(obj, source="the violation's example")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the history as indented JSON (one request per line) and return the path."""
        return session_format.FORMAT.write(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SessionHistory:
        """Read and validate a session history file; errors name the file and the line or field."""
        source = str(path)
        try:
            text = session_format.FORMAT.read_text(path)
        except FileTooLargeError as err:
            raise SessionFileError(f"{source}: not a session history: {err} (docs/contract.md, sessions)") from None
        except OSError as err:
            raise SessionFileError(f"{source}: cannot read the session history ({err.strerror or err})") from None
        except UnicodeDecodeError as err:
            raise SessionFileError(f"{source}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        try:
            obj = session_format.FORMAT.loads(text)
        except json.JSONDecodeError as err:
            raise SessionFileError(
                f"{source}: line {err.lineno} column {err.colno}: not valid JSON ({err.msg})"
            ) from None
        except ValueError as err:
            raise SessionFileError(f"{source}: not a session history: {err}") from None
        return cls.from_json(obj, source=source)


def _fmt(tokens: Sequence[int], limit: int = 12) -> str:
    seq = list(tokens)
    return str(seq) if len(seq) <= limit else f"<{len(seq)} tokens: {seq[:6]} ... {seq[-4:]}>"
