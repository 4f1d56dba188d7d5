"""specproof-engine/1: the schemas, and the client's clear errors for misbehaving engines (never a hang)."""

from __future__ import annotations

import base64
import json
import shlex
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from _wire_helpers import FAKE, start
from specproof.engine import PluginError
from specproof.plugins import resolve_plugin
from specproof.wire import (
    EngineProtocolError,
    EngineRequestError,
    ExecEngine,
    encode_digest,
    engine_from_spec,
    load_schema,
    message_errors,
    validate_message,
)
from specproof.wire._digest import projections
from specproof.wire._schemas import CLIENT_MESSAGES, ENGINE_MESSAGES
from specproof.wire._state_view import WireTargetView

B64_ONE = "AACAPw=="  # float32 1.0, little-endian

VALID: dict[str, dict[str, object]] = {
    "hello": {
        "type": "hello",
        "protocol": "specproof-engine/1",
        "engine": {"name": "x", "version": "1"},
        "vocab_size": 256,
        "max_context": 128,
        "k": 4,
        "rollback": "checkpoint",
        "capabilities": ["greedy", "suite_drafts", "state", "sessions"],
        "model": "trained",
        "atol": 1e-4,
        "tie_tolerance": 1e-3,
    },
    "generate": {
        "type": "generate",
        "id": 1,
        "prompt": [1, 2],
        "max_new_tokens": 3,
        "eos_token_id": None,
        "drafts": "suite",
        "state": True,
    },
    "greedy": {"type": "greedy", "id": 2, "prompt": [5], "max_new_tokens": 0},
    "reset": {"type": "reset", "id": 3},
    "shutdown": {"type": "shutdown", "id": 4},
    "draft": {"type": "draft", "id": 1, "round": 0, "tokens": [7, 8]},
    "propose": {"type": "propose", "id": 1, "round": 0, "context_length": 2, "k": 2},
    "round": {
        "type": "round",
        "id": 1,
        "round": 0,
        "base": 1,
        "draft": [7, 8],
        "argmax": [7, 9, 3],
        "accepted": [7, 9],
        "processed": 3,
    },
    "state": {
        "type": "state",
        "id": 1,
        "processed": 1,
        "arrays": {"conv_state": {"dtype": "float32", "shape": [1, 1, 1], "data": B64_ONE}},
    },
    "final": {
        "type": "final",
        "id": 1,
        "tokens": [7, 9],
        "stop_reason": "max_new_tokens",
        "processed": 3,
        "stats": {
            "rounds": 1,
            "emitted": 2,
            "prefill_forwards": 1,
            "verify_forwards": 1,
            "replay_forwards": 0,
            "drafted": 2,
            "accepted": 1,
            "position_attempts": [1, 1],
            "position_accepts": [1, 0],
        },
        "elapsed_us": 12.5,
    },
    "ok": {"type": "ok", "id": 3},
    "error": {"type": "error", "id": None, "message": "invalid JSON"},
    # capability batched (docs/protocol.md, Batches)
    "add_request": {
        "type": "add_request",
        "id": 5,
        "request": "r0",
        "prompt": [1, 2],
        "max_new_tokens": 3,
        "eos_token_id": None,
        "drafts": "suite",
        "sampling": {"temperature": 0.8, "seed": 7},
    },
    "step": {"type": "step", "id": 6, "only": ["r0"]},
    "abort": {"type": "abort", "id": 7, "request": "r0"},
    "preempt": {"type": "preempt", "id": 8, "request": "r0", "mode": "snapshot"},
    "stepped": {
        "type": "stepped",
        "id": 6,
        "outputs": [
            {
                "request": "r0",
                "round": {"round": 0, "base": 1, "draft": [7], "argmax": [7, 9], "accepted": [7, 9], "processed": 3},
                "tokens": [7, 9],
                "finished": None,
                "slot": 0,
            },
            {"request": "r1", "round": None, "tokens": [], "finished": {"tokens": [], "stop_reason": "error"}},
        ],
    },
}

# (message type, a change that makes it invalid, what the error names)
INVALID = [
    ("hello", {"protocol": "specproof-engine/2"}, "protocol"),
    ("hello", {"rollback": "rewind"}, "rollback"),
    ("hello", {"capabilities": [""]}, "capabilities"),
    ("hello", {"capabilities": ["state", "state"]}, "capabilities"),
    ("hello", {"k": -1}, "k"),
    ("generate", {"prompt": []}, "prompt"),
    ("generate", {"drafts": "oracle"}, "drafts"),
    ("generate", {"max_new_tokens": "3"}, "max_new_tokens"),
    ("draft", {"tokens": [1.5]}, "tokens"),
    ("propose", {"k": 0}, "k"),
    ("round", {"accepted": []}, "accepted"),
    ("round", {"processed": -1}, "processed"),
    ("state", {"arrays": {"x": {"dtype": "float16", "shape": [1], "data": ""}}}, "dtype"),
    ("final", {"stop_reason": "tired"}, "stop_reason"),
    ("final", {"extra": 1}, "extra"),
    ("error", {"message": ""}, "message"),
    ("hello", {"batch": {"max_batch": 0, "slots": 2}}, "max_batch"),
    ("hello", {"batch": {"max_batch": 2, "slots": 2, "preemption": ["swap"]}}, "preemption"),
    ("add_request", {"request": ""}, "request"),
    ("step", {"only": ["r0", "r0"]}, "only"),
    ("preempt", {"mode": "evict"}, "mode"),
    ("stepped", {"outputs": [{"request": "r0", "tokens": [1], "finished": None}]}, "round"),
    ("stepped", {"outputs": [{"request": "r0", "round": None, "tokens": [], "finished": {"tokens": []}}]}, "finished"),
]


def test_every_message_type_has_a_schema_and_a_valid_example() -> None:
    assert set(VALID) == set(ENGINE_MESSAGES) | set(CLIENT_MESSAGES)
    for name, example in VALID.items():
        schema = load_schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert message_errors(example) == [], name
        assert validate_message(example) == example


@pytest.mark.parametrize(("kind", "change", "field"), INVALID, ids=[f"{k}-{f}" for k, _, f in INVALID])
def test_invalid_messages_are_rejected_naming_the_field(kind: str, change: dict[str, object], field: str) -> None:
    bad = {**VALID[kind], **change}
    problems = message_errors(bad)
    assert problems, bad
    assert any(field in p for p in problems), problems
    with pytest.raises(EngineProtocolError, match="schema violation"):
        validate_message(bad)


REQUIRED = [(kind, field) for kind in sorted(VALID) for field in load_schema(kind)["required"] if field != "type"]


@pytest.mark.parametrize(("kind", "field"), REQUIRED, ids=[f"{k}-{f}" for k, f in REQUIRED])
def test_each_missing_required_field_is_rejected(kind: str, field: str) -> None:
    bad = {k: v for k, v in VALID[kind].items() if k != field}
    problems = message_errors(bad)
    assert any(f"'{field}' is a required property" in p for p in problems), problems


def test_every_message_with_required_fields_is_covered() -> None:
    kinds = {k for k, _ in REQUIRED}
    assert kinds == {k for k in VALID if set(load_schema(k)["required"]) - {"type"}}
    assert len(REQUIRED) >= 30  # every required field of every message, not the first of each


def test_unknown_type_and_unexpected_type() -> None:
    assert "not a message type" in message_errors({"type": "gossip"})[0]
    assert "JSON object" in message_errors([1, 2])[0]
    with pytest.raises(EngineProtocolError, match="unexpected message type 'ok'"):
        validate_message(VALID["ok"], expect=("final",))


def fake(mode: str, *, timeout: float = 5.0) -> ExecEngine:
    return start(FAKE, mode, timeout=timeout)


#: the timeout of an engine whose fault is seen at once, and the bound of what must not wait for a timeout:
#: generous, so that a slow start on a loaded machine is never taken for a hang (a hang is timed at 1.5 s)
_NO_WAIT = 30.0


def test_fake_engine_ok_handshake_and_requests() -> None:
    with fake("ok") as engine:
        assert (engine.vocab_size, engine.max_context, engine.k, engine.rollback) == (256, 64, 0, "replay")
        assert engine.capabilities == {"greedy"}
        assert engine.oracle is None and not hasattr(engine, "target")
        assert engine.greedy([3, 4], 3) == [4, 4, 4]
        gen = engine.generate([3, 4], 1)
        assert gen.tokens == (4,) and gen.steps is not None and len(gen.steps) == 1
        engine.reset()
        assert "fake engine starting" in engine.stderr_tail
    assert engine.returncode == 0  # shut down cleanly by close()


def test_a_fault_report_waits_for_stderr_the_engine_already_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    # A loaded CI runner once reported "(the engine wrote nothing to stderr)" for an engine that had:
    # the fault was seen on stdout before the stderr reader thread ran. A slow reader recreates that.
    from specproof.wire._transport import ProcessTransport

    drain = ProcessTransport._drain_stderr

    def slow_drain(self: ProcessTransport) -> None:
        time.sleep(0.3)
        drain(self)

    monkeypatch.setattr(ProcessTransport, "_drain_stderr", slow_drain)
    engine = fake("schema-violation", timeout=30.0)  # the fault comes at once: no timeout is what is tested
    try:
        with pytest.raises(EngineProtocolError) as info:
            engine.generate([3, 4], 2)
    finally:
        engine.close()
    assert "schema violation" in str(info.value)
    assert "fake engine starting in mode schema-violation" in info.value.stderr_tail


@pytest.mark.parametrize(
    ("mode", "what"),
    [
        ("invalid-json", "invalid JSON"),
        ("schema-violation", "schema violation"),
        ("unexpected-message", "unexpected message type 'hello'"),
        ("wrong-id", "answers request #101, not #1"),
        ("exit-mid-generation", "exited with status 139"),
        ("hang", "timed out after 1.5 s: no message"),
        ("noise", "invalid JSON (Expecting value at column 1)"),
        ("segv", "the engine was killed by signal 11 (SIGSEGV)"),
    ],
)
def test_misbehaving_engine_gives_a_clear_error_within_the_timeout(mode: str, what: str) -> None:
    # only the hang waits for the 1.5 s timeout; every other fault is seen at once, so its engine gets a
    # generous one (a loaded machine's slow start is never taken for a hang): bounds on counts of timeouts
    hang = mode == "hang"
    engine = fake(mode, timeout=1.5 if hang else _NO_WAIT)
    start = time.monotonic()
    with pytest.raises(EngineProtocolError) as info:
        engine.generate([3, 4], 2)
    elapsed = time.monotonic() - start
    assert (1.5 <= elapsed < _NO_WAIT) if hang else elapsed < _NO_WAIT  # the hang timed out; nothing else waited
    text = str(info.value)
    assert what in text
    assert FAKE.name in text  # the engine command
    assert "request generate #1 (prompt of 2 tokens [3, 4], max_new_tokens=2)" in text
    last = text.split("Last message received:")[1]  # the offending message, or the valid round before it
    assert '"type": "round"' in last or mode in ("schema-violation", "unexpected-message", "wrong-id", "noise")
    assert '"type"' in last or mode == "noise"
    assert "engine fake (exec:" in text  # named by the handshake's name, then how it was reached
    assert "fake engine starting in mode" in text  # the stderr tail
    assert "fake engine starting" in info.value.stderr_tail
    # the next request restarts the engine (a new process) and gets its own verdict
    engine.reset()
    assert engine.restarts == 1 and engine.faults == [engine.faults[0]]
    assert engine.faults[0].startswith("request generate #1") and what in engine.faults[0]
    assert engine.returncode is None  # the new process answered the reset
    with pytest.raises(EngineProtocolError, match="request generate #3"):
        engine.generate([3, 4], 2)
    assert engine.restarts == 1 and len(engine.faults) == 2
    # past max_restarts every request fails at once, naming the first failure once (no nesting)
    engine.max_restarts = 1
    engine.timeout = _NO_WAIT  # "at once": it waits for no timeout (and starts no engine)
    start = time.monotonic()
    with pytest.raises(EngineProtocolError) as later:
        engine.reset()
    assert time.monotonic() - start < _NO_WAIT
    assert "restarted 1 times (max_restarts=1)" in str(later.value)
    assert str(later.value).count("request generate #1 ") == 1 and str(later.value).count("failed") == 1
    start = time.monotonic()
    engine.close(timeout=1.0)
    assert time.monotonic() - start < _NO_WAIT  # a hang guard: close kills after its 1 s
    assert engine.returncode is not None


def test_exit_mid_generation_reports_stderr() -> None:
    with fake("exit-mid-generation") as engine, pytest.raises(EngineProtocolError) as info:
        engine.greedy([1], 2)
    assert "segmentation fault (pretend)" in str(info.value)


@pytest.mark.parametrize(
    ("mode", "what"),
    [
        ("hello-invalid", "schema violation"),
        ("hello-hang", "timed out after 1.5 s"),
        ("hello-exit", "exited with status 3"),
    ],
)
def test_broken_handshake(mode: str, what: str) -> None:
    hang = mode == "hello-hang"  # only the hang waits for the timeout (as above)
    start = time.monotonic()
    with pytest.raises(EngineProtocolError, match=what) as info:
        fake(mode, timeout=1.5 if hang else _NO_WAIT)
    elapsed = time.monotonic() - start
    assert (1.5 <= elapsed < _NO_WAIT) if hang else elapsed < _NO_WAIT
    assert "the handshake" in str(info.value)
    if mode == "hello-exit":
        assert "cannot load weights" in str(info.value)


def test_engine_error_message_is_a_request_error_and_the_engine_stays_usable() -> None:
    with fake("error") as engine:
        with pytest.raises(EngineRequestError, match="no model loaded"):
            engine.generate([1, 2], 2)
        engine.reset()  # still talking
        with pytest.raises(EngineRequestError, match="no model loaded"):
            engine.greedy([1, 2], 2)


def test_suite_drafts_need_the_capability() -> None:
    with fake("ok") as engine:
        engine.drafter = object()
        with pytest.raises(EngineRequestError, match="does not take drafts from the suite"):
            engine.generate([1, 2], 2)


def test_specs_and_plugins() -> None:
    with pytest.raises(EngineProtocolError, match="tcp:HOST:PORT"):
        engine_from_spec("tcp:localhost")
    with pytest.raises(EngineProtocolError, match="empty"):
        engine_from_spec("exec:")
    with pytest.raises(PluginError, match="cannot start it"):
        resolve_plugin("exec:/nonexistent/specproof-engine --weights x", kind="engine")
    with pytest.raises(PluginError, match="cannot connect"):
        resolve_plugin("tcp:127.0.0.1:1", kind="engine")
    command = shlex.join([sys.executable, str(FAKE), "ok"])
    engine = resolve_plugin(f"exec:{command}", kind="engine")
    try:
        assert engine.greedy([9], 1) == [9]  # type: ignore[attr-defined]
    finally:
        engine.close()  # type: ignore[attr-defined]
    quoted = engine_from_spec("exec:" + shlex.quote(command))()  # exec:'CMD ARGS' with the quotes kept
    quoted.close()


def test_schemas_are_json_files_with_ids() -> None:
    names = set()
    for name in ENGINE_MESSAGES + CLIENT_MESSAGES:
        schema = load_schema(name)
        assert schema["$id"].endswith(f"/specproof-engine/1/{name}.json")
        assert schema["properties"]["type"] == {"const": name}
        names.add(json.dumps(schema["required"]))
    assert names


def test_state_advertised_but_not_sent_is_a_clear_failure() -> None:
    with fake("no-state") as engine:
        assert engine.send_state
        with pytest.raises(EngineProtocolError, match=r"asked for the state .* sent 0 for 1 rounds"):
            engine.generate([3, 4], 1)
    # the twin: the same engine asked for no state is fine
    with start(FAKE, "no-state", timeout=5.0, state=False) as quiet:
        assert quiet.generate([3, 4], 1).tokens == (4,)


def test_without_suite_drafts_the_engine_has_no_drafter_attribute() -> None:
    # the suite then judges it on its own drafts instead of failing every check
    with fake("ok") as engine:
        assert not hasattr(engine, "drafter")
        assert engine.generate([3, 4], 1).tokens == (4,)


def test_protocol_doc_field_tables_equal_the_schemas() -> None:
    import re

    from specproof.wire import field_tables

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    block = re.search(r"<!-- fields:start[^\n]*-->\n(.*?)<!-- fields:end -->", doc, flags=re.S)
    assert block is not None, "docs/protocol.md has no generated field tables"
    assert block.group(1).strip() == field_tables().strip(), "regenerate with specproof.wire.field_tables()"
    tables = field_tables()
    for name in ENGINE_MESSAGES + CLIENT_MESSAGES:  # every field of every message, with its type
        for field in load_schema(name)["properties"]:
            assert f"| `{field}` |" in tables.split(f"#### `{name}`")[1].split("####")[0], (name, field)
    assert "|  |" not in tables  # every field says what it means


def test_field_tables_follow_a_schema_change(monkeypatch: pytest.MonkeyPatch) -> None:
    # the meta-test: a schema with a new field renders a different table (the doc test would then fail)
    import specproof.wire._schemas as schemas

    real = schemas.load_schema

    def changed(name: str) -> dict[str, object]:
        schema = real(name)
        if name == "ok":
            schema["properties"]["extra"] = {"type": "integer", "minimum": 1, "description": "new"}
        return schema

    monkeypatch.setattr(schemas, "load_schema", changed)
    assert "| `extra` | integer >= 1 | optional | new |" in schemas.field_tables()


@pytest.mark.parametrize("mode", ["ok-drafts", "ignore-drafts", "swap-drafts"])
def test_the_drafts_sent_are_kept_beside_the_drafts_reported(mode: str) -> None:
    # what an invariant comparing the round's draft with the suite's needs; a correct engine's agree
    hostile = Path(__file__).resolve().parents[1] / "_wire_hostile_engine.py"

    class Wrong:
        def propose(self, context: object, k: int) -> list[int]:
            return [255] * k  # never the repeat-the-last-token model's choice

    with ExecEngine([sys.executable, str(hostile), mode], timeout=5.0) as engine:
        engine.drafter = Wrong()
        gen = engine.generate([7, 7], 6)
        assert gen.steps is not None
        sent = engine.last_drafts_sent
        reported = {r: list(s.draft) for r, s in enumerate(gen.steps) if s.draft or r in sent}
        if mode == "ok-drafts":
            assert sent and all(reported[r] == d for r, d in sent.items())
        elif mode == "ignore-drafts":
            assert sent == {} and any(reported.values())  # drafts verified, none asked for
        else:
            assert sent and any(reported[r] != d for r, d in sent.items())


# --------------------------------------------------------------------------- state_delta (docs/protocol.md, state)


def _kv_message(
    rows: np.ndarray, processed: int, *, start: int | None = None, crc: int | None = None
) -> dict[str, object]:
    """A state message whose ``key_cache`` ([1, 1, n, 2]) is whole, or the rows from ``start`` on."""
    whole = np.ascontiguousarray(rows, dtype="<f4")
    spec: dict[str, object] = {"dtype": "float32", "shape": list(whole.shape)}
    if start is None:
        spec["data"] = base64.b64encode(whole.tobytes()).decode()
    else:
        part = np.ascontiguousarray(whole[:, :, start:], dtype="<f4")
        spec |= {"axis": 2, "start": start, "crc32": zlib.crc32(whole.tobytes()) if crc is None else crc}
        spec["data"] = base64.b64encode(part.tobytes()).decode()
    message = {"type": "state", "id": 1, "processed": processed, "arrays": {"key_cache": spec}}
    assert message_errors(message) == [], message_errors(message)
    return message


def test_state_deltas_rebuild_the_whole_array_and_a_changed_old_row_is_named() -> None:
    rows = np.arange(10, dtype=np.float32).reshape(1, 1, 5, 2)
    view = WireTargetView(256, 64, "t")
    view.begin_request()
    view.update(_kv_message(rows[:, :, :3], 3), delta=True)  # the first message of a request: whole
    view.update(_kv_message(rows, 5, start=3), delta=True)  # correct: only rows 3 and 4 sent
    assert np.array_equal(view.state_arrays()["key_cache"], rows) and view.state_problem is None
    assert view.delta_arrays == 1 and view.rows_left_out == 3
    # a correct-but-different engine: resends rows it need not (start 1 < 3) -- accepted
    view.update(_kv_message(rows, 5, start=1), delta=True)
    assert np.array_equal(view.state_arrays()["key_cache"], rows) and view.state_problem is None
    # a broken engine: row 0 changed in the engine (the CRC is of its real array), but is not resent
    changed = rows.copy()
    changed[0, 0, 0, 0] += 0.01
    view.update(_kv_message(changed, 5, start=4), delta=True)
    assert view.state_problem is not None and "'key_cache'" in view.state_problem
    assert "rows before 4 changed" in view.state_problem and "processed=5" in view.state_problem
    view.begin_request()  # a new request starts clean
    assert view.state_problem is None


@pytest.mark.parametrize(
    ("setup", "message", "delta", "what"),
    [
        ([], "delta-first", True, "no earlier state message of this request"),
        (["whole3"], "delta-not-asked", False, "did not ask for state_delta"),
        (["whole3"], "start-past-base", True, "does not extend"),
        (["whole3"], "short-data", True, "bytes of data"),
    ],
)
def test_malformed_state_deltas_are_protocol_errors(setup: list[str], message: str, delta: bool, what: str) -> None:
    rows = np.arange(10, dtype=np.float32).reshape(1, 1, 5, 2)
    view = WireTargetView(256, 64, "t")
    view.begin_request()
    if setup:
        view.update(_kv_message(rows[:, :, :3], 3), delta=True)
    if message == "start-past-base":
        bad = _kv_message(rows, 5, start=4)  # rows 3..4 would be missing: the client holds only 0..2
    elif message == "short-data":
        bad = _kv_message(rows, 5, start=3)
        bad["arrays"]["key_cache"]["data"] = B64_ONE  # type: ignore[index]
    else:
        bad = _kv_message(rows, 5, start=3 if setup else 0)
    with pytest.raises(EngineProtocolError, match=what):
        view.update(bad, delta=delta)


def test_schema_requires_axis_and_crc_with_start() -> None:
    message = _kv_message(np.zeros((1, 1, 2, 2), np.float32), 2, start=1)
    del message["arrays"]["key_cache"]["crc32"]  # type: ignore[index]
    assert any("crc32" in e for e in message_errors(message))


def test_wire_state_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROOF_WIRE_STATE", "partial")
    with pytest.raises(EngineProtocolError, match=r"SPECPROOF_WIRE_STATE='partial'.*'digest', 'delta' or 'full'"):
        engine_from_spec("exec:true")
    with pytest.raises(ValueError, match="full_state"):
        start(FAKE, "ok", full_state="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="choose one"):
        start(FAKE, "ok", full_state=True, state_mode="digest")
    with pytest.raises(ValueError, match="state_mode"):
        start(FAKE, "ok", state_mode="sketch")


def test_digest_seeds_are_secret_per_client_and_stable_per_request() -> None:
    """The same request replays with the same signs (a shrinking search sees one verdict); another
    request, or another client, gets others."""
    with (
        start(FAKE, "ok", timeout=10) as one,
        start(FAKE, "ok", timeout=10) as two,
    ):
        seed = one._digest_seed([1, 2, 3], 8, None)
        assert seed == one._digest_seed([1, 2, 3], 8, None) and 0 <= seed < 2**53
        assert seed != one._digest_seed([1, 2, 3], 9, None) and seed != two._digest_seed([1, 2, 3], 8, None)


def test_a_newer_engines_unknown_capabilities_are_accepted_and_ignored() -> None:
    """Forward compatibility (docs/protocol.md, Capabilities): a name the client does not know changes nothing."""
    with start(FAKE, "future-capabilities", timeout=10) as engine:
        assert "telepathy" in engine.capabilities and engine.state_kind() == "none"
        assert isinstance(engine.greedy([1, 2], 2), list)


# --------------------------------------------------------------------------- state_digest (docs/protocol.md, state)

ATOL = 5e-4
SEED, N = 12345, 2


def _state(kv: np.ndarray, conv: np.ndarray, **kv_digest: object) -> dict[str, object]:
    """A state message: key_cache ([2, 2, n, 24]) as a digest (from ``start`` with ``start=``), conv whole-digested."""
    processed = kv.shape[2]
    arrays = {
        "key_cache": encode_digest(kv, seed=SEED, n=N, **kv_digest),  # type: ignore[arg-type]
        "conv_state": encode_digest(conv, seed=SEED, n=N, slice_axes=2),
    }
    message = {"type": "state", "id": 1, "processed": processed, "arrays": arrays}
    assert message_errors(message) == [], message_errors(message)
    return message


def _reference(n: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(2, 2, n, 24)).astype(np.float32), rng.normal(size=(2, 8, 3)).astype(np.float32)


def _judge(kv: np.ndarray, conv: np.ndarray, ref_kv: np.ndarray, ref_conv: np.ndarray, *, split: int = 4) -> str | None:
    """Two state messages of one request (rows ``< split`` whole, then the rest from ``split``), each judged."""
    view = WireTargetView(256, 64, "t")
    view.begin_request(digest=(SEED, N))
    view.update(_state(kv[:, :, :split], conv))
    first = view.state_differs({"key_cache": ref_kv[:, :, :split], "conv_state": ref_conv}, atol=ATOL)
    if first:
        return first
    view.update(_state(kv, conv, axis=2, start=split))
    return view.state_differs({"key_cache": ref_kv, "conv_state": ref_conv}, atol=ATOL)


def test_a_crc_equal_to_the_reference_does_not_excuse_sums_that_differ() -> None:
    # an engine bug that takes the CRC from one buffer (the reference-equal state) and the sums from
    # another (a stale copy): the sums still decide
    ref_kv, ref_conv = _reference()
    stale = ref_kv.copy()
    stale[1, 0, 3] += 0.5
    message = _state(stale, ref_conv)
    message["arrays"]["key_cache"]["crc32"] = _state(ref_kv, ref_conv)["arrays"]["key_cache"]["crc32"]  # type: ignore[index]
    view = WireTargetView(256, 64, "t")
    view.begin_request(digest=(SEED, N))
    view.update(message)
    why = view.state_differs({"key_cache": ref_kv, "conv_state": ref_conv}, atol=ATOL)
    assert why is not None and "key_cache differs at" in why and view.digest_crc_matches == 2


def test_a_digested_state_changes_the_views_fingerprint() -> None:
    # certification tells a live view from a stale one by its fingerprint; digests carry no values,
    # so the fingerprint must see the CRC and sums (a change at the same processed count included)
    ref_kv, ref_conv = _reference()
    view = WireTargetView(256, 64, "t")
    view.begin_request(digest=(SEED, N))
    view.update(_state(ref_kv, ref_conv))
    before = view.fingerprint()
    view.begin_request(digest=(SEED, N))
    view.update(_state(ref_kv, ref_conv + 1.0))
    assert view.processed == 7 and view.fingerprint() != before


def test_digests_accept_the_reference_and_correct_but_different_engines() -> None:
    ref_kv, ref_conv = _reference()
    view = WireTargetView(256, 64, "t")
    view.begin_request(digest=(SEED, N))
    view.update(_state(ref_kv, ref_conv))
    assert view.state_differs({"key_cache": ref_kv, "conv_state": ref_conv}, atol=0.0) is None  # bit-identical
    assert view.digest_crc_matches == 2 and view.digest_slices_compared == 2 * 2 * 7 + 2  # every slice
    with pytest.raises(ValueError, match="state_differs"):
        view.state_arrays()  # no values came: the view says how to compare instead
    rng = np.random.default_rng(1)
    for scale in (0.25, 1.0):  # atol/4 per element with random signs; atol exactly, every element
        kv = ref_kv + (scale * ATOL * rng.choice([-1.0, 1.0], size=ref_kv.shape)).astype(np.float32)
        conv = ref_conv + (scale * ATOL * rng.choice([-1.0, 1.0], size=ref_conv.shape)).astype(np.float32)
        assert _judge(kv, conv, ref_kv, ref_conv) is None, scale
    # the tightest case: every element atol off with the sign of projection 0, so |dp_0| = atol * m
    unit = np.broadcast_to(np.eye(24), (2, 2, 7, 24, 24)).transpose(0, 1, 2, 4, 3)
    r0 = np.stack([projections(unit[..., i], seed=SEED, n=1, slice_axes=1)[0][..., 0] for i in range(24)], -1)
    tight = (ref_kv.astype(np.float64) + 0.999 * ATOL * r0).astype(np.float32)
    assert np.abs(tight.astype(np.float64) - ref_kv).max() <= ATOL
    assert _judge(tight, ref_conv, ref_kv, ref_conv) is None


def _bugs() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    ref_kv, ref_conv = _reference(8)
    stale = ref_conv.copy()
    stale[:, :, -1] = _reference(9)[1][:, :, 0]  # the last tap from another context (a rejected token's)
    shifted = np.concatenate([ref_kv[:, :, 1:], ref_kv[:, :, -1:]], axis=2)  # off by one: row p holds p + 1
    swapped = ref_kv.copy()
    swapped[1, 0, 6] = swapped[1, 0, 6, ::-1]  # one row's elements reversed (a transposed/permuted row)
    heads = ref_kv.copy()
    heads[:, :, 5:] = ref_kv[:, ::-1, 5:]  # heads swapped in the new rows: sums and norms agree
    return {
        "stale-conv": (ref_kv, stale),
        "off-by-one-kv": (shifted[:, :, :8], ref_conv),
        "permuted-row": (swapped, ref_conv),
        "swapped-heads": (heads, ref_conv),
    }


@pytest.mark.parametrize("bug", sorted(_bugs()))
def test_digests_reject_planted_state_bugs_naming_the_slice(bug: str) -> None:
    ref_kv, ref_conv = _reference(8)
    kv, conv = _bugs()[bug]
    why = _judge(kv, conv, ref_kv, ref_conv, split=4)
    assert why is not None, bug
    array = "conv_state" if bug == "stale-conv" else "key_cache"
    assert f"{array} differs at layer " in why and "signed projection" in why and "the bound" in why
    assert "in the engine" in why and "in the reference" in why and "SPECPROOF_WIRE_STATE=full" in why


def test_digests_judge_non_finite_slices_by_finiteness() -> None:
    """A reference slice holding inf (or NaN) needs a non-finite engine projection; finite needs finite."""
    ref_kv, ref_conv = _reference()
    ref_kv[0, 0, 5, 7] = np.inf
    same = ref_kv.copy()
    same[0, 0, 5, 0] += ATOL / 2  # not bit-identical: the projections are compared
    assert _judge(same, ref_conv, ref_kv, ref_conv) is None
    finite = ref_kv.copy()
    finite[0, 0, 5, 7] = 1.0
    assert "position 5" in str(_judge(finite, ref_conv, ref_kv, ref_conv))


def test_digests_show_a_changed_old_row_by_its_prefix_crc() -> None:
    ref_kv, ref_conv = _reference()
    view = WireTargetView(256, 64, "t")
    view.begin_request(digest=(SEED, N))
    view.update(_state(ref_kv[:, :, :4], ref_conv))
    changed = ref_kv.copy()
    changed[0, 0, 0, 0] += 0.01  # a row reported long ago changes (native --bug old-kv-row)
    view.update(_state(changed, ref_conv, axis=2, start=4))
    why = view.state_differs({"key_cache": ref_kv, "conv_state": ref_conv}, atol=ATOL)
    assert why is not None and "rows before 4 changed" in why and "'key_cache'" in why


def test_digests_can_miss_an_error_spread_within_a_slice_as_documented() -> None:
    """docs/protocol.md: an error below atol * m within one slice can pass a digest; whole arrays catch it."""
    ref_kv, ref_conv = _reference()
    kv = ref_kv.copy()
    kv[0, 1, 2, 3] += 3 * ATOL  # one element 3 atol off: |dp| <= 3 atol < 24 atol
    assert _judge(kv, ref_conv, ref_kv, ref_conv) is None
    view = WireTargetView(256, 64, "t")
    view.begin_request()
    view.update(_kv_message(kv, 7))
    assert "key_cache differs at (0, 1, 2, 3)" in str(view.state_differs({"key_cache": ref_kv}, atol=ATOL))


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ("short", "a digest of 27 floats"),
        ("no-crc", "needs crc32"),
        ("slice-past-rank", "a digest's slice of 5 trailing axes"),
        ("start-not-previous", "start must be its length along the axis"),
        ("no-prefix", "needs prefix_crc32"),
        ("not-asked", "did not ask for state_digest"),
        ("not-base64", "not padded base64"),
    ],
)
def test_malformed_digests_are_protocol_errors(change: str, what: str) -> None:
    ref_kv, ref_conv = _reference()
    view = WireTargetView(256, 64, "t")
    view.begin_request(digest=None if change == "not-asked" else (SEED, N))
    if change in ("start-not-previous", "no-prefix"):
        view.update(_state(ref_kv[:, :, :4], ref_conv))
    message = _state(ref_kv, ref_conv, **({"axis": 2, "start": 3} if change == "start-not-previous" else {}))
    spec = message["arrays"]["key_cache"]  # type: ignore[index]
    if change == "short":
        spec["digest"] = base64.b64encode(np.zeros(27, "<f4").tobytes()).decode()
    elif change == "no-crc":
        del spec["crc32"]
    elif change == "slice-past-rank":
        spec["slice"] = 5
    elif change == "no-prefix":
        spec |= {"axis": 2, "start": 4}
        spec["digest"] = encode_digest(ref_kv, seed=SEED, n=N, axis=2, start=4)["digest"]
    elif change == "not-base64":
        spec["digest"] = "%%%"
    with pytest.raises(EngineProtocolError, match=what):
        view.update(message)


def test_the_schema_takes_data_or_a_digest_never_both() -> None:
    message = _state(*_reference())
    spec = message["arrays"]["key_cache"]  # type: ignore[index]
    spec["data"] = B64_ONE
    assert message_errors(message)
    del spec["data"], spec["digest"]
    assert message_errors(message)


# ---- the digest key: a failure's signs drawn again in another run, never shown to the engine ----

KEY = "00112233445566778899aabbccddeeff"


def test_a_digest_key_gives_the_same_seeds_in_another_client(monkeypatch: pytest.MonkeyPatch) -> None:
    def seed() -> int:
        with fake("ok") as engine:
            return engine._digest_seed([3, 4], 5, None)

    fresh = {seed(), seed()}
    assert len(fresh) == 2  # by default each client draws its own key (the check can fail)
    monkeypatch.setenv("SPECPROOF_WIRE_DIGEST_KEY", KEY)
    assert seed() == seed()


@pytest.mark.parametrize("raw", ["xyz", "0011", KEY + "00"])
def test_a_malformed_digest_key_is_refused_before_any_engine_starts(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("SPECPROOF_WIRE_DIGEST_KEY", raw)
    with pytest.raises(EngineProtocolError, match=r"\$SPECPROOF_WIRE_DIGEST_KEY=.*32 hex digits"):
        engine_from_spec("exec:/nonexistent/engine")


def test_the_engine_process_never_sees_the_digest_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROOF_WIRE_DIGEST_KEY", KEY)
    tell = "import os, sys; sys.stderr.write(os.environ.get('SPECPROOF_WIRE_DIGEST_KEY', 'no key') + chr(10))"
    with pytest.raises(EngineProtocolError) as info:
        ExecEngine([sys.executable, "-c", tell], timeout=5.0)
    assert "no key" in str(info.value) and KEY not in str(info.value)


def test_a_digest_failure_names_the_key_that_draws_its_signs_again() -> None:
    ref_kv, ref_conv = _reference()
    view = WireTargetView(256, 64, "t")
    view.digest_key = KEY
    view.begin_request(digest=(SEED, N))
    view.update(_state(ref_kv, ref_conv + 1.0))
    why = view.state_differs({"key_cache": ref_kv, "conv_state": ref_conv}, atol=ATOL)
    assert why is not None and f"$SPECPROOF_WIRE_DIGEST_KEY={KEY}" in why
