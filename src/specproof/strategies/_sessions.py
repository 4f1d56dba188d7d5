"""``SessionMachine``: request sequences on one live engine, each compared with plain greedy.

Engines keep caches between ``generate`` calls: prefix caching (a prompt sharing a prefix
with the last context reuses its KV and recurrent state), multi-turn chat (the last
context plus a user turn), "regenerate" (the same prompt again) and edited prompts. A
bug there only shows after the right *sequence* of requests: a rollback across a call
boundary that reaches further back than the snapshots the engine kept restores stale conv
or recurrent state, silently. Every other check builds a fresh engine per example, so it
never sees one.

The machine holds ONE engine instance for a whole run and issues requests to it:

- ``new_prompt``: a prompt from ``contexts`` (sometimes long; sometimes sharing nothing
  with any earlier context);
- ``regenerate``: the last request's prompt again (maybe with another budget and EOS);
- ``edit``: the last context (prompt + output) cut at a drawn point — inside the prompt,
  inside the output, or right at its end — then a diverging suffix;
- ``multi_turn``: the last context plus a user turn (sometimes an earlier context plus
  a turn: a branch);
- ``earlier_prefix``: a prefix of an *earlier* context (most often exactly an earlier
  request's prompt), so the engine must reach further back than the last call's snapshots;
- ``reset``: ``engine.reset()``, where the engine has one (never straight after a cold start,
  and no ``new_prompt`` there either: a one-request session tests what a fresh engine does).

Each request draws its ``max_new_tokens`` and an EOS (none, among the greedy
continuation's tokens, or — most often — among its last ``k + 1`` tokens before the
budget, where an EOS lands inside the last accepted block). Where the engine has a
settable ``drafter`` (or the harness passes a ``set_drafter`` hook), the machine draws a
``RoundPlan`` and installs a ``ScriptedDrafter`` for the request, so the engine is driven
down every rollback path on any target. Up to two rules are switched off per run (swarm
testing on top of Hypothesis's own), so each run stresses a different mix.

Every request's tokens are compared with plain greedy from the oracle, tie-aware
(``compare_lossless``), and its length and stop reason are checked. Given a
``reference_factory`` and an engine whose live ``target`` has ``state_arrays()``, the
target must also hold exactly the context after each request (a stale state that the next
tokens do not reveal — a short conv window refilled, a decaying recurrent state, a zero
budget — shows there). A failure raises
``ViolationError`` with one ``engine.session`` violation whose ``example`` holds the whole
request history (``{"history": [...], "failing_request": i}``); ``SessionHistory``
saves it as a ``specproof-session/1`` file, and ``replay_session`` replays it on a fresh
engine, installing the same scripted drafts, so it fails again. ``shrink_history``
shortens a failing history by replays (drop requests, then simplify EOS, budget and plan):
far cheaper than Hypothesis's shrinker, which re-runs whole sessions for every choice.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any, ClassVar, Protocol

import attrs
from hypothesis import event
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from specproof.contract import STOP_REASONS, UsageError, Violation, ViolationError, states_differ
from specproof.contract.files import FileTooLargeError, loads_bounded, read_bounded_text, write_text_file
from specproof.contract.lossless import compare_lossless
from specproof.engine import greedy_with_margins
from specproof.engine.errors import InvalidSettingError
from specproof.strategies._contexts import CONTEXT_KINDS, check_kinds, contexts
from specproof.strategies._machine import check_tolerance, configured_machine
from specproof.strategies._rounds import PlannedRound, RoundPlan, ScriptedDrafter, round_plans

__all__ = [
    "REQUEST_KINDS",
    "SESSION_FORMAT",
    "SESSION_INVARIANT",
    "GreedyOracle",
    "SessionFileError",
    "SessionHistory",
    "SessionMachine",
    "SessionRequest",
    "engine_greedy",
    "replay_session",
    "run_session_machine",
    "shrink_history",
    "target_greedy",
]

SESSION_FORMAT = "specproof-session/1"
SESSION_INVARIANT = "engine.session"

# Request kinds, in the order the machine's rules are listed. "reset" carries no prompt.
REQUEST_KINDS: tuple[str, ...] = ("new_prompt", "regenerate", "edit", "multi_turn", "earlier_prefix", "reset")
# Rules a run may switch off (swarm testing: a run with new_prompt and reset off is one long session).
_SWITCHABLE: tuple[str, ...] = (
    "branch_back",
    "new_prompt",
    "regenerate",
    "edit",
    "multi_turn",
    "earlier_prefix",
    "reset",
)
_DRAFTERS: tuple[str, ...] = ("scripted", "engine")
_DEFAULT_K = 4  # the plan's draft budget for an engine that does not say its k


class GreedyOracle(Protocol):
    """``greedy(prompt, max_new_tokens, eos_token_id) -> (tokens, top-2 margins or None)``: plain greedy."""

    def __call__(
        self, prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None, /
    ) -> tuple[list[int], list[float] | None]: ...


SetDrafter = Callable[[Any, Sequence[int], Sequence[int], RoundPlan], None]


class SessionFileError(UsageError):
    """A ``specproof-session/1`` history (file or JSON object) is malformed; the message names the field."""


# --------------------------------------------------------------------------- oracles


def target_greedy(target: Any) -> GreedyOracle:
    """A ``GreedyOracle`` over a Target the engine does not decode on (``greedy_with_margins``; margins given)."""

    def greedy(prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None) -> tuple[list[int], list[float]]:
        gen, margins = greedy_with_margins(target, prompt, max_new_tokens, eos_token_id=eos_token_id)
        return [int(t) for t in gen.tokens], [float(m) for m in margins]

    return greedy


def engine_greedy(engine: Any) -> GreedyOracle:
    """A ``GreedyOracle`` over an engine's own ``greedy(prompt, max_new_tokens) -> list[int]`` (no margins).

    Pass an engine instance the machine does not drive (a second one from the factory):
    an oracle that shares the engine's caches could hide the bug it is meant to judge.
    """
    method = getattr(engine, "greedy", None)
    if not callable(method):
        raise InvalidSettingError(f"engine_greedy: {engine!r} has no greedy(prompt, max_new_tokens) method")

    def greedy(prompt: Sequence[int], max_new_tokens: int, eos_token_id: int | None) -> tuple[list[int], None]:
        tokens = [int(t) for t in method(list(prompt), max_new_tokens)]
        if eos_token_id is not None and eos_token_id in tokens:
            tokens = tokens[: tokens.index(eos_token_id) + 1]
        return tokens, None

    return greedy


# --------------------------------------------------------------------------- the history record


def _field_error(source: str, where: str, problem: str) -> SessionFileError:
    return SessionFileError(f"{source}: {where} {problem}")


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
    ``note`` says in words how the prompt was made (for people; replay ignores it).
    A ``reset`` request has an empty prompt and ``max_new_tokens == 0``.
    """

    kind: str
    prompt: tuple[int, ...] = ()
    max_new_tokens: int = 0
    eos_token_id: int | None = None
    drafter: str | None = None
    plan: tuple[tuple[int, int], ...] | None = None
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
        if self.note:
            out["note"] = self.note
        return out

    def describe(self) -> str:
        """One line: ``edit(prompt=[...], max_new_tokens=8, eos_token_id=None, plan=[...]) -- note``."""
        if self.kind == "reset":
            return "reset()"
        plan = "" if self.plan is None else ", plan=" + self.round_plan().describe()  # type: ignore[union-attr]
        drafter = "" if self.drafter in (None, "scripted") else f", drafter={self.drafter}"
        text = (
            f"{self.kind}(prompt={_fmt(self.prompt)}, max_new_tokens={self.max_new_tokens}, "
            f"eos_token_id={self.eos_token_id}{drafter}{plan})"
        )
        return f"{text} -- {self.note}" if self.note else text

    @classmethod
    def from_json(cls, obj: object, *, source: str, where: str, vocab_size: int | None) -> SessionRequest:
        if not isinstance(obj, Mapping):
            raise _field_error(source, where, f"must be a JSON object, got {type(obj).__name__}")
        known = {"kind", "prompt", "max_new_tokens", "eos_token_id", "drafter", "plan", "note"}
        extra = sorted(set(obj) - known)
        if extra:
            raise _field_error(
                source, f"{where}.{extra[0]}", f"is not a known field (known: {', '.join(sorted(known))})"
            )
        kind = obj.get("kind")
        if kind not in REQUEST_KINDS:
            raise _field_error(source, f"{where}.kind", f"= {kind!r} is not one of {', '.join(REQUEST_KINDS)}")
        note = obj.get("note", "")
        if not isinstance(note, str):
            raise _field_error(source, f"{where}.note", f"must be a string, got {note!r}")
        if kind == "reset":
            return cls(kind="reset", note=note)
        for name in ("prompt", "max_new_tokens"):
            if name not in obj:
                raise _field_error(source, where, f"has no {name!r} field (a {kind} request needs one)")
        prompt = obj["prompt"]
        if not isinstance(prompt, list) or not prompt:
            raise _field_error(source, f"{where}.prompt", "must be a non-empty list of token ids")
        tokens = tuple(
            _int_field(t, source=source, where=f"{where}.prompt[{i}]", maximum=vocab_size) for i, t in enumerate(prompt)
        )
        budget = _int_field(obj["max_new_tokens"], source=source, where=f"{where}.max_new_tokens")
        eos = obj.get("eos_token_id")
        if eos is not None:
            eos = _int_field(eos, source=source, where=f"{where}.eos_token_id", maximum=vocab_size)
        drafter = obj.get("drafter")
        if drafter is not None and drafter not in _DRAFTERS:
            raise _field_error(source, f"{where}.drafter", f"= {drafter!r} is not null or one of {_DRAFTERS}")
        raw_plan = obj.get("plan")
        plan: tuple[tuple[int, int], ...] | None = None
        if raw_plan is not None:
            if drafter != "scripted":
                raise _field_error(source, f"{where}.plan", f"is given but drafter is {drafter!r}, not 'scripted'")
            if not isinstance(raw_plan, list) or not raw_plan:
                raise _field_error(source, f"{where}.plan", "must be a non-empty list of [draft_length, correct] pairs")
            rounds = []
            for r, pair in enumerate(raw_plan):
                at = f"{where}.plan[{r}]"
                if not isinstance(pair, list) or len(pair) != 2:
                    raise _field_error(source, at, f"must be a [draft_length, correct] pair, got {pair!r}")
                length = _int_field(pair[0], source=source, where=f"{at}[0] (draft_length)")
                correct = _int_field(pair[1], source=source, where=f"{at}[1] (correct)")
                if correct > length:
                    raise _field_error(source, at, f"has correct={correct} > draft_length={length}")
                rounds.append((length, correct))
            plan = tuple(rounds)
        elif drafter == "scripted":
            raise _field_error(source, f"{where}.plan", "is missing: a scripted request needs its plan")
        return cls(
            kind=kind,
            prompt=tokens,
            max_new_tokens=budget,
            eos_token_id=eos,
            drafter=drafter,
            plan=plan,
            note=note,
        )


@attrs.frozen(kw_only=True)
class SessionHistory:
    """Every request of a session, in order, and which one failed: what ``replay_session`` replays.

    JSON (``specproof-session/1``)::

        {"format": "specproof-session/1", "vocab_size": 64, "engine": "mypkg.engine:make",
         "failing_request": 3, "requests": [{"kind": "new_prompt", "prompt": [...],
         "max_new_tokens": 8, "eos_token_id": null, "drafter": "scripted",
         "plan": [[4, 4], [4, 1]], "note": "..."}, ...]}

    ``engine`` (optional) names the plug-in the history was recorded on; ``failing_request``
    (optional) the index of the request that failed.
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
        fmt = obj.get("format")
        if fmt != SESSION_FORMAT:
            raise _field_error(source, "format", f"= {fmt!r}; expected {SESSION_FORMAT!r}")
        known = {"format", "vocab_size", "engine", "failing_request", "requests"}
        extra = sorted(set(obj) - known)
        if extra:
            raise _field_error(source, extra[0], f"is not a known field (known: {', '.join(sorted(known))})")
        vocab = obj.get("vocab_size")
        if vocab is not None:
            vocab = _int_field(vocab, source=source, where="vocab_size", minimum=1)
        engine = obj.get("engine")
        if engine is not None and not isinstance(engine, str):
            raise _field_error(source, "engine", f"must be a string or null, got {engine!r}")
        raw = obj.get("requests")
        if not isinstance(raw, list) or not raw:
            raise _field_error(source, "requests", "must be a non-empty list of requests")
        requests = tuple(
            SessionRequest.from_json(r, source=source, where=f"requests[{i}]", vocab_size=vocab)
            for i, r in enumerate(raw)
        )
        failing = obj.get("failing_request")
        if failing is not None:
            failing = _int_field(failing, source=source, where="failing_request", maximum=len(requests))
        return cls(requests=requests, vocab_size=vocab, engine=engine, failing_request=failing)

    @classmethod
    def from_example(cls, example: Mapping[str, object], *, vocab_size: int | None = None) -> SessionHistory:
        """From an ``engine.session`` violation's ``example`` (``{"history": [...], "failing_request": i}``)."""
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
        out = Path(path)
        data = self.to_json()
        requests = data.pop("requests")
        head = json.dumps(data, indent=1)[:-2]  # the object without its closing brace
        body = ",\n".join("  " + json.dumps(r, separators=(", ", ": ")) for r in requests)  # type: ignore[attr-defined]
        write_text_file(out, f'{head},\n "requests": [\n{body}\n ]\n}}\n')
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SessionHistory:
        """Read and validate a ``specproof-session/1`` file; errors name the file and the line or field."""
        source = str(path)
        try:
            text = read_bounded_text(path)
        except FileTooLargeError as err:
            raise SessionFileError(f"{source}: not a session history: {err} (docs/contract.md, sessions)") from None
        except OSError as err:
            raise SessionFileError(f"{source}: cannot read the session history ({err.strerror or err})") from None
        except UnicodeDecodeError as err:
            raise SessionFileError(f"{source}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        try:
            obj = loads_bounded(text)
        except json.JSONDecodeError as err:
            raise SessionFileError(
                f"{source}: line {err.lineno} column {err.colno}: not valid JSON ({err.msg})"
            ) from None
        except ValueError as err:
            raise SessionFileError(f"{source}: not a session history: {err}") from None
        return cls.from_json(obj, source=source)


def _count_of(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _fmt(tokens: Sequence[int], limit: int = 12) -> str:
    seq = list(tokens)
    return str(seq) if len(seq) <= limit else f"<{len(seq)} tokens: {seq[:6]} ... {seq[-4:]}>"


# --------------------------------------------------------------------------- running requests


class _SessionRunner:
    """Issues requests to one engine and judges each against the oracle; shared by the machine and replay."""

    def __init__(
        self,
        engine: Any,
        *,
        greedy: GreedyOracle,
        vocab_size: int,
        tie_tolerance: float,
        set_drafter: SetDrafter | None,
        memo: dict[tuple[int, ...], tuple[int, list[int], list[float] | None]] | None = None,
        ask_at_least: int = 0,
        reference: Any = None,
        atol: float = 0.0,
    ) -> None:
        self.engine = engine
        self.greedy = greedy
        self.vocab_size = vocab_size
        self.tie_tolerance = tie_tolerance
        self.set_drafter = set_drafter
        self.settable = set_drafter is not None or hasattr(engine, "drafter")
        # "engine": the drafter the engine came with, put back for requests that use it
        self.own_drafter = getattr(engine, "drafter", None)
        self.can_choose_own = set_drafter is None and self.settable
        self.can_reset = callable(getattr(engine, "reset", None))
        self.history: list[SessionRequest] = []
        # plain greedy is a function of the prompt: one memo may serve every example of a run
        self._greedy_memo = {} if memo is None else memo
        self.ask_at_least = ask_at_least  # ask the oracle for this many tokens at least (fewer calls)
        # white-box: the live target's state after each request against a fresh reference's
        live = getattr(engine, "target", None)
        self.live = live if reference is not None and callable(getattr(live, "state_arrays", None)) else None
        self.reference: Any = reference if self.live is not None else None
        self.atol = atol

    @property
    def plan_k(self) -> int:
        k = getattr(self.engine, "k", None)
        if isinstance(k, Integral) and not isinstance(k, bool) and int(k) >= 0:
            return int(k)
        return _DEFAULT_K

    def continuation(self, prompt: Sequence[int], n: int) -> tuple[list[int], list[float] | None]:
        """Plain greedy's first ``n`` tokens after ``prompt`` (no EOS), memoised per prompt."""
        key = tuple(prompt)
        memo = self._greedy_memo.get(key)
        if memo is not None and (memo[0] >= n or len(memo[1]) < memo[0]):
            _, tokens, margins = memo
            return tokens[:n], None if margins is None else margins[:n]
        ask = max(n, self.ask_at_least)
        tokens, margins = self.greedy(list(prompt), ask, None)
        tokens = [int(t) for t in tokens]
        margins = None if margins is None else [float(m) for m in margins]
        self._greedy_memo[key] = (ask, tokens, margins)
        return tokens[:n], None if margins is None else margins[:n]

    def _install(self, req: SessionRequest, continuation: list[int]) -> None:
        if req.drafter is None:
            return
        if not self.settable:
            raise UsageError(
                f"the session asks for drafter={req.drafter!r} but the engine {self.engine!r} has no settable "
                "'drafter' and no set_drafter hook was given"
            )
        if req.drafter == "engine":
            if not self.can_choose_own:
                raise UsageError("the session puts back the engine's own drafter, which a set_drafter hook cannot do")
            self.engine.drafter = self.own_drafter
            return
        plan = req.round_plan()
        assert plan is not None  # SessionRequest.from_json guarantees a plan for scripted requests
        if self.set_drafter is not None:
            self.set_drafter(self.engine, list(req.prompt), list(continuation), plan)
        else:
            self.engine.drafter = ScriptedDrafter(req.prompt, continuation, plan, vocab_size=self.vocab_size)

    def run(self, req: SessionRequest) -> tuple[list[int], Violation | None]:
        """Append ``req`` to the history, run it; return the engine's tokens and the violation, if any."""
        index = len(self.history)
        self.history.append(req)
        if req.kind == "reset":
            try:
                self.engine.reset()
            except Exception as err:
                return [], self._violation(index, f"engine.reset() raised {type(err).__name__}: {err}", None, None)
            return [], None
        prompt = list(req.prompt)
        n = req.max_new_tokens
        continuation, margins = self.continuation(prompt, n)
        expected = list(continuation)
        expected_margins = margins
        expected_stop = "max_new_tokens" if len(continuation) >= n else "context_full"
        if req.eos_token_id is not None and req.eos_token_id in expected:
            cut = expected.index(req.eos_token_id) + 1
            expected = expected[:cut]
            expected_margins = None if margins is None else margins[:cut]
            expected_stop = "eos"
        self._install(req, continuation)
        try:
            gen = self.engine.generate(prompt, n, eos_token_id=req.eos_token_id)
        except Exception as err:
            return [], self._violation(
                index, f"generate raised {type(err).__name__}: {err}", expected, None, stop=expected_stop
            )
        tokens = [int(t) for t in getattr(gen, "tokens", ())]
        stop = getattr(gen, "stop_reason", None)
        verdict = compare_lossless(
            tokens,
            expected,
            expected_margins=expected_margins,
            tie_tolerance=self.tie_tolerance,
            actual_stop_reason=stop if stop in STOP_REASONS and stop != "error" else None,
            expected_stop_reason=expected_stop,
        )
        if verdict.status == "fail":
            return tokens, self._violation(index, verdict.explanation, expected, tokens, stop=expected_stop)
        if verdict.status == "excused":
            event("SessionMachine: an excused near-tie")
            return tokens, self._check_state(index, [*prompt, *tokens])
        if len(tokens) != len(expected):
            return tokens, self._violation(
                index,
                f"the engine emitted {len(tokens)} tokens (stop {stop!r}); plain greedy emits {len(expected)} "
                f"({expected_stop})",
                expected,
                tokens,
                stop=expected_stop,
            )
        if stop != expected_stop:
            return tokens, self._violation(
                index,
                f"the tokens equal plain greedy's but stop_reason is {stop!r}; it must be {expected_stop!r}",
                expected,
                tokens,
                stop=expected_stop,
            )
        return tokens, self._check_state(index, [*prompt, *tokens])

    def _check_state(self, index: int, ctx: list[int]) -> Violation | None:
        """White-box (a reference given, the engine's live target has ``state_arrays``): the target holds ``ctx[:-1]``.

        The decode convention leaves the target at every token but the pending one after a
        generation; its state must equal a fresh reference's fed ``ctx[:-1]`` with plain
        forwards (bitwise, or within ``atol``). A stale recurrent state that the next tokens
        happen not to reveal (a short conv window refilled, a decaying recurrent state) shows here.
        """
        if self.live is None:
            return None
        processed = int(self.live.processed)
        if processed != len(ctx) - 1:
            return self._violation(
                index,
                f"after the request the engine's target has processed {processed} tokens; the context has "
                f"{len(ctx)}, so it must be {len(ctx) - 1} (every token but the pending one)",
                len(ctx) - 1,
                processed,
            )
        ref = self.reference
        ref.reset()
        if len(ctx) > 1:
            ref.forward(ctx[:-1])
        problem = states_differ(ref.state_arrays(), self.live.state_arrays(), atol=self.atol)
        if problem is None:
            return None
        return self._violation(
            index,
            f"the tokens equal plain greedy's, but the engine's target does not hold the context: {problem} "
            f"(the reference was fed ctx[:-1], {len(ctx) - 1} tokens, with plain forwards)",
            None,
            None,
        )

    def _violation(
        self,
        index: int,
        why: str,
        expected: list[int] | int | None,
        actual: list[int] | int | None,
        *,
        stop: str | None = None,
    ) -> Violation:
        req = self.history[index]
        before = "the first request" if index == 0 else f"after {index} earlier request(s) on the same engine"
        history = SessionHistory(requests=tuple(self.history), vocab_size=self.vocab_size, failing_request=index)
        explanation = f"request {index} ({req.kind}), {before}: {why}"
        if stop is not None and expected is not None:
            explanation += f" [greedy stops at {stop}]"
        example = history.to_json()
        return Violation(
            invariant=SESSION_INVARIANT,
            explanation=explanation,
            expected=expected,
            actual=actual,
            example={"history": example["requests"], "failing_request": index, "vocab_size": self.vocab_size},
        )


def _raise(violation: Violation) -> None:
    err = ViolationError([violation])
    history = SessionHistory.from_example(violation.example)
    err.add_note(f"the whole session ({len(history.requests)} requests on one engine instance):\n{history.describe()}")
    raise err


def replay_session(
    history: SessionHistory,
    *,
    engine_factory: Callable[[], Any],
    greedy: GreedyOracle,
    vocab_size: int,
    tie_tolerance: float = 0.0,
    set_drafter: SetDrafter | None = None,
    reference_factory: Callable[[], Any] | None = None,
    atol: float = 0.0,
) -> list[Violation]:
    """Replay ``history`` request by request on a fresh ``engine_factory()``; the violations found (at most one).

    Scripted requests get the same ``ScriptedDrafter`` (same plan, continuation from
    ``greedy``) or the same ``set_drafter`` call as when recorded. The replay stops at
    the first failing request (later requests build on a context it got wrong).
    Pass the same ``reference_factory`` / ``atol`` as the run that recorded the history:
    a failure found by the white-box state check needs it to fail again.
    """
    replay = _Replayer.make(
        history,
        "replay_session()",
        engine_factory=engine_factory,
        greedy=greedy,
        vocab_size=vocab_size,
        tie_tolerance=tie_tolerance,
        set_drafter=set_drafter,
        reference_factory=reference_factory,
        atol=atol,
    )
    violation = replay(history.requests)
    return [] if violation is None else [violation]


def shrink_history(
    history: SessionHistory,
    *,
    engine_factory: Callable[[], Any],
    greedy: GreedyOracle,
    vocab_size: int,
    tie_tolerance: float = 0.0,
    set_drafter: SetDrafter | None = None,
    reference_factory: Callable[[], Any] | None = None,
    atol: float = 0.0,
    max_replays: int = 200,
) -> SessionHistory:
    """A shorter history that still fails on a fresh engine (the history itself when it does not fail).

    Cheap next to Hypothesis's shrinker (which re-runs whole sessions for every choice it
    simplifies): cut after the failing request; drop requests one at a time while the
    replay still fails; then, per request, no EOS and a smaller ``max_new_tokens``. Prompts
    are left as they are (their shared prefixes are what the failure is about). At most
    ``max_replays`` replays, each on a fresh ``engine_factory()``.
    """
    replay = _Replayer.make(
        history,
        "shrink_history()",
        engine_factory=engine_factory,
        greedy=greedy,
        vocab_size=vocab_size,
        tie_tolerance=tie_tolerance,
        set_drafter=set_drafter,
        reference_factory=reference_factory,
        atol=atol,
    )
    if isinstance(max_replays, bool) or not isinstance(max_replays, int) or max_replays < 1:
        raise InvalidSettingError(f"shrink_history: max_replays={max_replays!r} must be an integer >= 1")
    budget = [max_replays]

    def failing_prefix(requests: Sequence[SessionRequest]) -> list[SessionRequest] | None:
        """The requests up to the one that fails, or None when the replay passes (or the budget is spent)."""
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        violation = replay(requests)
        if violation is None:
            return None
        index = violation.example.get("failing_request")
        return list(requests[: int(index) + 1]) if isinstance(index, int) else list(requests)

    current = failing_prefix(history.requests)
    if current is None:
        return history
    changed = True
    while changed and budget[0] > 0:
        changed = False
        i = len(current) - 2  # latest first: the requests right before the failure matter most
        while i >= 0 and budget[0] > 0:
            candidate = failing_prefix([*current[:i], *current[i + 1 :]])
            if candidate is not None:
                current, changed = candidate, True
            i = min(i - 1, len(current) - 2)
    for i in range(len(current)):
        for simplify in _SIMPLIFICATIONS:
            simpler = simplify(current[i])
            if simpler is None or simpler == current[i]:
                continue
            candidate = failing_prefix([*current[:i], simpler, *current[i + 1 :]])
            if candidate is not None and len(candidate) == len(current):
                current[i] = simpler
    return SessionHistory(
        requests=tuple(_renote(current, replay.continuation)),
        vocab_size=history.vocab_size if history.vocab_size is not None else vocab_size,
        engine=history.engine,
        failing_request=len(current) - 1,
    )


def _renote(
    requests: Sequence[SessionRequest], continuation: Callable[[Sequence[int], int], list[int]]
) -> list[SessionRequest]:
    """Notes that say how each request relates to the one before it in the *shrunk* history.

    The recorded notes name contexts of the original run ("context 4 of 6"), which the
    shrunk history no longer has; the previous context is the previous prompt plus its
    plain-greedy output (what a correct engine emitted).
    """
    out: list[SessionRequest] = []
    previous: list[int] | None = None
    prev_prompt: tuple[int, ...] = ()
    for req in requests:
        if req.kind == "reset":
            out.append(attrs.evolve(req, note="the engine forgets its caches"))
            previous = None
            continue
        prompt = list(req.prompt)
        if previous is None:
            note = "a cold start" if out else "the first request"
        else:
            common = next(
                (i for i, (a, b) in enumerate(zip(previous, prompt)) if a != b), min(len(previous), len(prompt))
            )
            if req.prompt == prev_prompt:
                note = "the previous prompt again"
            elif common == 0:
                note = "shares nothing with the previous context"
            else:
                note = f"shares its first {common} tokens with the previous context ({len(prev_prompt)} prompt + "
                note += f"{len(previous) - len(prev_prompt)} output tokens)"
        out.append(attrs.evolve(req, note=note))
        output = continuation(prompt, req.max_new_tokens)
        if req.eos_token_id is not None and req.eos_token_id in output:
            output = output[: output.index(req.eos_token_id) + 1]
        previous, prev_prompt = [*prompt, *output], req.prompt
    return out


def _without_eos(req: SessionRequest) -> SessionRequest | None:
    return None if req.kind == "reset" else attrs.evolve(req, eos_token_id=None)


def _budget_to(fraction: float) -> Callable[[SessionRequest], SessionRequest | None]:
    def smaller(req: SessionRequest) -> SessionRequest | None:
        if req.kind == "reset":
            return None
        return attrs.evolve(req, max_new_tokens=int(req.max_new_tokens * fraction))

    return smaller


def _first_planned_round(req: SessionRequest) -> SessionRequest | None:
    return None if req.plan is None else attrs.evolve(req, plan=req.plan[:1])


# tried in order on each request of a shrunk history, each kept if the replay still fails there
_SIMPLIFICATIONS: tuple[Callable[[SessionRequest], SessionRequest | None], ...] = (
    _without_eos,
    _budget_to(0.0),
    _budget_to(0.5),
    _first_planned_round,
)


class _Replayer:
    """Replays request lists on fresh engines, sharing one greedy memo (shrinking replays the same prompts)."""

    def __init__(self, make_runner: Callable[[], _SessionRunner]) -> None:
        self.make_runner = make_runner
        self._oracle: _SessionRunner | None = None

    def continuation(self, prompt: Sequence[int], n: int) -> list[int]:
        """Plain greedy's first ``n`` tokens after ``prompt`` (from the shared memo)."""
        if self._oracle is None:
            self._oracle = self.make_runner()
        return self._oracle.continuation(prompt, n)[0]

    @classmethod
    def make(
        cls,
        history: SessionHistory,
        where: str,
        *,
        engine_factory: Callable[[], Any],
        greedy: GreedyOracle,
        vocab_size: int,
        tie_tolerance: float,
        set_drafter: SetDrafter | None,
        reference_factory: Callable[[], Any] | None,
        atol: float,
    ) -> _Replayer:
        if not isinstance(history, SessionHistory):
            raise InvalidSettingError(f"{where}: history must be a SessionHistory, got {type(history).__name__}")
        if not callable(engine_factory) or not callable(greedy):
            raise InvalidSettingError(f"{where}: engine_factory and greedy must be callable")
        if history.vocab_size is not None and history.vocab_size != vocab_size:
            raise UsageError(
                f"{where}: the history was recorded with vocab_size={history.vocab_size}; the engine has {vocab_size}"
            )
        tol = _check_tolerance(tie_tolerance, where)
        state_atol = _check_tolerance(atol, where, name="atol")
        if reference_factory is not None and not callable(reference_factory):
            raise InvalidSettingError(f"{where}: reference_factory={reference_factory!r} must be callable or None")
        memo: dict[tuple[int, ...], tuple[int, list[int], list[float] | None]] = {}
        ask = max((r.max_new_tokens for r in history.requests), default=0)

        def make_runner() -> _SessionRunner:
            return _SessionRunner(
                engine_factory(),
                greedy=greedy,
                vocab_size=vocab_size,
                tie_tolerance=tol,
                set_drafter=set_drafter,
                memo=memo,
                ask_at_least=ask,
                reference=None if reference_factory is None else reference_factory(),
                atol=state_atol,
            )

        return cls(make_runner)

    def __call__(self, requests: Sequence[SessionRequest]) -> Violation | None:
        runner = self.make_runner()
        for req in requests:
            _, violation = runner.run(req)
            if violation is not None:
                return violation
        return None


# --------------------------------------------------------------------------- the machine


def _check_tolerance(value: object, where: str, name: str = "tie_tolerance") -> float:
    return check_tolerance(value, where=where, name=name)


@attrs.frozen(kw_only=True)
class _SessionConfig:
    engine_factory: Callable[[], Any]
    greedy: GreedyOracle
    vocab_size: int
    max_context: int | None
    tie_tolerance: float
    max_prompt: int
    max_new_tokens: int
    set_drafter: SetDrafter | None
    context_kinds: tuple[str, ...]
    reference_factory: Callable[[], Any] | None
    atol: float
    # greedy continuations by prompt, shared by every example of the configured class (shrinking
    # replays the same prompts hundreds of times); the oracle is deterministic, so this is safe
    greedy_memo: dict[tuple[int, ...], tuple[int, list[int], list[float] | None]] = attrs.field(
        factory=dict, eq=False, repr=False
    )


def _switched_on(name: str) -> Callable[[SessionMachine], bool]:
    return lambda self: name not in self.disabled


class SessionMachine(RuleBasedStateMachine):
    """Requests on one live engine, each compared with plain greedy (abstract: use ``configure``).

    See the module docstring for the rules. ``observed`` (per configured class) counts
    the request kinds, drafter choices and EOS placements exercised.
    """

    _session_config: ClassVar[_SessionConfig | None] = None
    observed: ClassVar[Counter[str]] = Counter()

    @classmethod
    def configure(
        cls,
        *,
        engine_factory: Callable[[], Any],
        greedy: GreedyOracle,
        vocab_size: int,
        max_context: int | None = None,
        tie_tolerance: float = 0.0,
        max_prompt: int = 32,
        max_new_tokens: int = 12,
        set_drafter: SetDrafter | None = None,
        context_kinds: Iterable[str] | None = None,
        stateful_step_count: int = 10,
        reference_factory: Callable[[], Any] | None = None,
        atol: float = 0.0,
        name: str | None = None,
    ) -> type[SessionMachine]:
        """A runnable subclass for one engine under test.

        ``engine_factory()`` builds the engine (once per run: the whole run is one
        session); ``greedy(prompt, n, eos)`` is the plain-greedy oracle (``target_greedy``
        over a fresh target, or ``engine_greedy`` over a second engine); ``max_context``
        defaults to the engine's ``max_context`` (prompts stay within
        ``max_context - max_new_tokens``); ``set_drafter(engine, prompt, continuation, plan)``
        installs a scripted drafter where setting ``engine.drafter`` is not the way.
        ``reference_factory()`` (optional) builds a fresh Target of the same model: where the
        engine exposes its live ``target`` with ``state_arrays()``, the target must hold
        exactly the context after every request (``processed == len(ctx) - 1`` and the state
        arrays of a reference fed ``ctx[:-1]``, bitwise or within ``atol``).
        """
        where = "SessionMachine.configure()"
        if not callable(engine_factory):
            raise InvalidArgument(f"{where}: engine_factory={engine_factory!r} must be callable")
        if not callable(greedy):
            raise InvalidArgument(f"{where}: greedy={greedy!r} must be callable (prompt, n, eos) -> (tokens, margins)")
        if set_drafter is not None and not callable(set_drafter):
            raise InvalidArgument(f"{where}: set_drafter={set_drafter!r} must be callable or None")
        if reference_factory is not None and not callable(reference_factory):
            raise InvalidArgument(f"{where}: reference_factory={reference_factory!r} must be callable or None")
        for opt, value, minimum in (
            ("vocab_size", vocab_size, 2),
            ("max_prompt", max_prompt, 1),
            ("max_new_tokens", max_new_tokens, 1),
            ("stateful_step_count", stateful_step_count, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidArgument(f"{where}: {opt}={value!r} must be an integer >= {minimum}")
        if max_context is not None:
            if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < max_new_tokens + 2:
                raise InvalidArgument(
                    f"{where}: max_context={max_context!r} must be an integer >= max_new_tokens + 2 "
                    f"= {max_new_tokens + 2} (room for a two-token prompt and the budget), or None"
                )
        config = _SessionConfig(
            engine_factory=engine_factory,
            greedy=greedy,
            vocab_size=vocab_size,
            max_context=max_context,
            tie_tolerance=_check_tolerance(tie_tolerance, where),
            max_prompt=max_prompt,
            max_new_tokens=max_new_tokens,
            set_drafter=set_drafter,
            context_kinds=check_kinds(context_kinds, known=CONTEXT_KINDS, where=where),
            reference_factory=reference_factory,
            atol=_check_tolerance(atol, where, name="atol"),
        )
        return configured_machine(
            cls,
            name or f"{cls.__name__}For_{getattr(engine_factory, '__name__', 'engine')}",
            {"_session_config": config, "observed": Counter()},
            stateful_step_count=stateful_step_count,
        )

    # ----------------------------------------------------------------- set-up

    def __init__(self) -> None:
        super().__init__()
        cfg = type(self)._session_config
        if cfg is None:
            raise InvalidSettingError(
                "SessionMachine is a base class: build a runnable machine with "
                "SessionMachine.configure(engine_factory=..., greedy=..., vocab_size=...) (or run_session_machine)"
            )
        self.cfg = cfg
        engine = cfg.engine_factory()
        engine_vocab = getattr(engine, "vocab_size", cfg.vocab_size)
        if int(engine_vocab) != cfg.vocab_size:
            raise InvalidSettingError(
                f"SessionMachine: the engine has vocab_size={engine_vocab}; the machine was configured with "
                f"{cfg.vocab_size}"
            )
        max_context = cfg.max_context
        if max_context is None:
            own = getattr(engine, "max_context", None)
            max_context = int(own) if isinstance(own, Integral) and not isinstance(own, bool) else None
        if max_context is None:
            max_context = 4 * cfg.max_prompt + cfg.max_new_tokens
        if max_context < cfg.max_new_tokens + 2:
            raise InvalidSettingError(
                f"SessionMachine: max_context={max_context} leaves no room for a prompt of two tokens and "
                f"max_new_tokens={cfg.max_new_tokens}"
            )
        self.prompt_limit = max_context - cfg.max_new_tokens  # every prompt fits with its whole budget
        self.runner = _SessionRunner(
            engine,
            greedy=cfg.greedy,
            vocab_size=cfg.vocab_size,
            tie_tolerance=cfg.tie_tolerance,
            set_drafter=cfg.set_drafter,
            memo=cfg.greedy_memo,
            ask_at_least=cfg.max_new_tokens,
            reference=None if cfg.reference_factory is None else cfg.reference_factory(),
            atol=cfg.atol,
        )
        self.disabled: frozenset[str] = frozenset()
        self.contexts: list[list[int]] = []  # every context (prompt + output) so far, oldest first
        self.prompt_lengths: list[int] = []  # the prompt length of each context
        self.since_cold = 0  # requests since the last reset or unrelated prompt
        self.last_prompt: list[int] = []

    # ----------------------------------------------------------------- requests

    def _count(self, tag: str) -> None:
        type(self).observed[tag] += 1
        event(f"SessionMachine: {tag}")

    def _request(self, data: Any, kind: str, prompt: list[int], note: str) -> None:
        cfg = self.cfg
        runner = self.runner
        k = runner.plan_k
        # "max" first: failures shrink toward the full budget; "zero" positions the cache and emits nothing
        budget_kind = data.draw(st.sampled_from(("max", "any", "max", "any", "max", "zero")), label="budget kind")
        n = {"max": cfg.max_new_tokens, "zero": 0}.get(budget_kind)
        if n is None:
            n = data.draw(st.integers(1, cfg.max_new_tokens), label="max_new_tokens")
        continuation, _ = runner.continuation(prompt, n)
        eos: int | None = None
        eos_kind = data.draw(
            st.sampled_from(("none", "last_k_plus_1", "anywhere", "last_k_plus_1")), label="eos placement"
        )
        if eos_kind != "none" and continuation:
            pool = continuation[-(k + 1) :] if eos_kind == "last_k_plus_1" else continuation
            eos = data.draw(st.sampled_from(pool), label="eos_token_id")
            self._count(f"eos:{eos_kind}")
        drafter: str | None = None
        plan: tuple[tuple[int, int], ...] | None = None
        if runner.settable:
            drafter = "scripted"
            if runner.can_choose_own:
                drafter = data.draw(st.sampled_from(_DRAFTERS), label="drafter")
            if drafter == "scripted":
                drawn: RoundPlan = data.draw(round_plans(k=k, max_rounds=6), label="round plan")
                plan = tuple((r.draft_length, r.correct) for r in drawn.rounds)
            self._count(f"drafter:{drafter}")
        req = SessionRequest(
            kind=kind, prompt=tuple(prompt), max_new_tokens=n, eos_token_id=eos, drafter=drafter, plan=plan, note=note
        )
        self._count(f"request:{kind}")
        tokens, violation = runner.run(req)
        if violation is not None:
            _raise(violation)
        self.contexts.append([*prompt, *tokens])
        self.prompt_lengths.append(len(prompt))
        self.last_prompt = list(prompt)
        self.since_cold += 1

    def _fresh_prompt(self, data: Any) -> tuple[list[int], str]:
        cfg = self.cfg
        top = min(cfg.max_prompt, self.prompt_limit)
        shape = data.draw(st.sampled_from(("ordinary", "long", "unrelated")), label="prompt shape")
        low = max(1, top // 2) if shape == "long" else 1
        prompt = data.draw(
            contexts(cfg.vocab_size, min_size=low, max_size=top, kinds=cfg.context_kinds), label="prompt"
        )
        prompt = [int(t) for t in prompt]
        if shape == "unrelated":
            # share nothing with any earlier context: a first token none of them starts with, if there is one
            firsts = {c[0] for c in self.contexts if c}
            free = [t for t in range(cfg.vocab_size) if t not in firsts]
            if free and prompt[0] in firsts:
                prompt[0] = free[prompt[0] % len(free)]
        return prompt, f"a new prompt ({shape}, {_count_of(len(prompt), 'token')})"

    @initialize(data=st.data())
    def first_request(self, data: Any) -> None:
        """Draw which rules this run uses (swarm testing), then the session's first prompt."""
        # at most two rules off: a run left with one rule (only regenerate, only new prompts) tests little
        off = data.draw(st.sets(st.sampled_from(_SWITCHABLE), max_size=0), label="rules off")
        self.disabled = frozenset(off)
        prompt, note = self._fresh_prompt(data)
        self._request(data, "new_prompt", prompt, note)

    # not straight after a cold start either: sessions of a single request test nothing a fresh engine does not
    @precondition(lambda self: "new_prompt" not in self.disabled and self.since_cold >= 2)
    @rule(data=st.data())
    def new_prompt(self, data: Any) -> None:
        """A new prompt: ordinary, long, or sharing nothing with any earlier context."""
        prompt, note = self._fresh_prompt(data)
        self.since_cold = 0
        self._request(data, "new_prompt", prompt, note)

    @precondition(_switched_on("regenerate"))
    @rule(data=st.data())
    def regenerate(self, data: Any) -> None:
        """The last request's prompt again (its budget and EOS drawn afresh)."""
        self._request(data, "regenerate", list(self.last_prompt), "the previous prompt again")

    @precondition(_switched_on("edit"))
    @rule(data=st.data())
    def edit(self, data: Any) -> None:
        """The last context cut at a drawn point (in the prompt, in the output, at its end), then a new suffix."""
        base = self.contexts[-1]
        prompt_len = len(self.last_prompt)
        cap = self.prompt_limit - 1  # room for at least one suffix token
        where = data.draw(
            st.sampled_from(("inside_output", "output_end", "inside_prompt", "anywhere")), label="edit point kind"
        )
        if where == "inside_output" and len(base) > prompt_len:
            lo, hi = prompt_len, len(base) - 1
        elif where == "output_end":
            lo = hi = len(base)
        elif where == "inside_prompt":
            lo, hi = 1, max(1, prompt_len - 1)
        else:
            lo, hi = 1, len(base)
        hi = min(hi, cap)
        lo = min(lo, hi)
        cut = data.draw(st.integers(lo, hi), label="edit point")
        room = self.prompt_limit - cut
        suffix = data.draw(
            contexts(self.cfg.vocab_size, min_size=1, max_size=min(8, room), kinds=self.cfg.context_kinds),
            label="new suffix",
        )
        suffix = [int(t) for t in suffix]
        if cut < len(base) and suffix[0] == base[cut]:
            suffix[0] = (suffix[0] + 1) % self.cfg.vocab_size  # diverge right at the edit point
        prompt = [*base[:cut], *suffix]
        self._count(f"edit:{where}")
        note = f"the last context ({prompt_len} prompt + {len(base) - prompt_len} output tokens) cut at {cut} ({where})"
        self._request(data, "edit", prompt, note + f", then {_count_of(len(suffix), 'new token')}")

    # Named to sort first: Hypothesis lists rules alphabetically and its simplest program repeats
    # the first, so even the first (simplest) example of a run crosses two call boundaries.
    @precondition(lambda self: "branch_back" not in self.disabled and len(self.contexts[-1]) < self.prompt_limit)
    @rule(data=st.data())
    def branch_back(self, data: Any) -> None:
        """A user turn on the last context, then the prompt before it again: back across two call boundaries.

        What a chat user does who goes on, then returns to regenerate the earlier answer;
        the engine needs the state it had at the end of that earlier prompt, two requests back.
        """
        before = list(self.last_prompt)
        base = self.contexts[-1]
        turn = data.draw(
            contexts(
                self.cfg.vocab_size,
                min_size=1,
                max_size=min(8, self.prompt_limit - len(base)),
                kinds=self.cfg.context_kinds,
            ),
            label="user turn",
        )
        prompt = [*base, *(int(t) for t in turn)]
        self._request(data, "multi_turn", prompt, f"the last context ({len(base)} tokens) + a {len(turn)}-token turn")
        self._count("branch_back")
        self._request(data, "earlier_prefix", before, "back to the prompt before that turn (two calls back)")

    def _fits_a_turn(self) -> bool:
        return any(len(c) < self.prompt_limit for c in self.contexts)

    @precondition(lambda self: "multi_turn" not in self.disabled and self._fits_a_turn())
    @rule(data=st.data())
    def multi_turn(self, data: Any) -> None:
        """A context (prompt + output) and a user turn of 1..8 tokens.

        Usually the last context; sometimes an earlier one (a branch: the user goes back and
        writes another turn there), which reaches behind the last call's snapshots.
        """
        fits = [i for i, c in enumerate(self.contexts) if len(c) < self.prompt_limit]
        last = len(self.contexts) - 1
        which = "last" if last in fits else "earlier"
        if which == "last" and len(fits) > 1:
            which = data.draw(st.sampled_from(("last", "earlier")), label="turn on which context")
        if which == "earlier":
            earlier = [i for i in fits if i != last]
            back = data.draw(st.sampled_from(earlier[::-1]), label="earlier context (latest first)")
        else:
            back = last
        base = self.contexts[back]
        turn = data.draw(
            contexts(
                self.cfg.vocab_size,
                min_size=1,
                max_size=min(8, self.prompt_limit - len(base)),
                kinds=self.cfg.context_kinds,
            ),
            label="user turn",
        )
        prompt = [*base, *(int(t) for t in turn)]
        self._count(f"multi_turn:{which}")
        where = "the last context" if back == last else f"context {back} of {len(self.contexts)}"
        self._request(data, "multi_turn", prompt, f"{where} ({len(base)} tokens) + a {len(turn)}-token turn")

    @precondition(_switched_on("earlier_prefix"))
    @rule(data=st.data())
    def earlier_prefix(self, data: Any) -> None:
        """A prefix of an earlier context: a rollback past the last call's snapshots.

        Most often exactly an earlier request's prompt (a user going back to regenerate an
        older turn: the engine's snapshot from that call is the one it needs), else a drawn cut.
        """
        # the context before the last one is where a rollback crosses two call boundaries
        which = "any"
        if len(self.contexts) >= 2:
            which = data.draw(st.sampled_from(("any", "before_last")), label="which context")
        if which == "before_last":
            back = len(self.contexts) - 2
        else:
            back = data.draw(st.integers(0, len(self.contexts) - 1), label="which earlier context (0 = oldest)")
        ctx = self.contexts[back]
        where = data.draw(st.sampled_from(("its_prompt", "anywhere", "its_prompt")), label="prefix kind")
        if where == "its_prompt" and self.prompt_lengths[back] <= self.prompt_limit:
            cut = self.prompt_lengths[back]
        else:
            cut = data.draw(st.integers(1, min(len(ctx), self.prompt_limit)), label="prefix length")
        self._count(f"earlier_prefix:{where}")
        note = f"the first {cut} tokens of context {back} of {len(self.contexts)} ({len(ctx)} tokens; {where})"
        self._request(data, "earlier_prefix", ctx[:cut], note)

    # not straight after a cold start: a reset there tests nothing a fresh engine does not
    @precondition(lambda self: "reset" not in self.disabled and self.runner.can_reset and self.since_cold >= 2)
    @rule()
    def reset(self) -> None:
        """``engine.reset()``: the engine must forget its caches (the next request starts cold)."""
        self._count("request:reset")
        _, violation = self.runner.run(SessionRequest(kind="reset"))
        if violation is not None:
            _raise(violation)
        self.since_cold = 0


def run_session_machine(
    *,
    engine_factory: Callable[[], Any],
    greedy: GreedyOracle,
    vocab_size: int,
    max_context: int | None = None,
    tie_tolerance: float = 0.0,
    max_prompt: int = 32,
    max_new_tokens: int = 12,
    set_drafter: SetDrafter | None = None,
    context_kinds: Iterable[str] | None = None,
    stateful_step_count: int = 10,
    reference_factory: Callable[[], Any] | None = None,
    atol: float = 0.0,
    settings: Settings | None = None,
) -> type[SessionMachine]:
    """Configure a ``SessionMachine`` and run it (``run_state_machine_as_test``).

    Raises the shrunk failure (a ``ViolationError`` carrying one ``engine.session``
    violation whose example is the whole history); returns the configured class
    (its ``observed`` counts what was exercised).
    """
    machine = SessionMachine.configure(
        engine_factory=engine_factory,
        greedy=greedy,
        vocab_size=vocab_size,
        max_context=max_context,
        tie_tolerance=tie_tolerance,
        max_prompt=max_prompt,
        max_new_tokens=max_new_tokens,
        set_drafter=set_drafter,
        context_kinds=context_kinds,
        stateful_step_count=stateful_step_count,
        reference_factory=reference_factory,
        atol=atol,
    )
    run_state_machine_as_test(machine, settings=settings or machine.TestCase.settings)
    return machine
