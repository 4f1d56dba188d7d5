"""An engine cannot take the suite down: bounded lines, depth, shapes and handshake sizes;
capacity bounded by the profile; a fault restarts the engine and the first cause is kept
(docs/protocol.md, "Limits"). Each hostile scenario has a legitimate twin that is accepted."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from _processes import running_processes
from _wire_helpers import HOSTILE, Certified, certify_command, exec_spec, start
from specproof.wire import EngineProtocolError, ExecEngine, TcpEngine
from specproof.wire._limits import MAX_DEPTH, parse_line
from specproof.wire._state_view import WireTargetView

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

_WIRE_TIMEOUT = {"SPECPROOF_WIRE_TIMEOUT": "5"}


def hostile(mode: str, *, timeout: float = 5.0, **kw: object) -> ExecEngine:
    return start(HOSTILE, mode, timeout=timeout, **kw)


def _certify(args: list[str], *, timeout: float = 600.0) -> Certified:
    """``specproof certify ARGS`` in a child, 5 s per engine message; ``timeout`` only guards against a
    hang (generous: a loaded machine's certify is never taken for one)."""
    return certify_command(args, timeout=timeout, env=_WIRE_TIMEOUT)


# --------------------------------------------------------------------------- line length


def test_an_endless_line_is_cut_at_the_limit() -> None:
    engine = hostile("flood")
    assert engine.max_line_bytes == 4 << 20  # no state capability: token lists only
    with pytest.raises(EngineProtocolError) as info:  # an endless line never ends without the limit
        engine.greedy([1, 2], 3)
    text = str(info.value)
    assert "a 'state' message longer than the limit of 4194304 bytes" in text
    assert "4194305 bytes seen" in text and "request greedy #1" in text and "hostile-flood" in text
    engine.close(timeout=1.0)
    assert engine.returncode is not None


def test_the_line_limit_is_settable_and_a_line_under_it_is_accepted() -> None:
    # the correct-but-different twin: a long legitimate line (a greedy answer of many tokens)
    with hostile("ok") as engine:
        assert engine.greedy([7], 60) == [7] * 60
    with pytest.raises(ValueError, match="max_line_bytes"):
        hostile("ok", max_line_bytes=10)
    with hostile("flood", max_line_bytes=100_000) as small:
        with pytest.raises(EngineProtocolError, match="limit of 100000 bytes"):
            small.greedy([1], 1)


def test_a_flooding_handshake_is_cut_at_the_handshake_limit() -> None:
    with pytest.raises(EngineProtocolError, match="names no message type longer than the limit of 1048576"):
        hostile("flood-hello")


@pytest.mark.parametrize("transport", ["exec", "tcp"])
def test_certify_against_a_flooding_engine_stays_under_1_gb_and_leaves_no_process(transport: str) -> None:
    tag = f"tag-{uuid.uuid4().hex}"
    server = None
    if transport == "exec":
        spec = exec_spec(HOSTILE, "flood", tag)
    else:
        server = subprocess.Popen(
            [sys.executable, str(HOSTILE), "flood", "--tcp", tag], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        spec = f"tcp:127.0.0.1:{port}"
    try:
        done = _certify(["engine", "--engine", spec, "--profile", "quick", "--only", "engine.lossless"])
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=5)
    assert done.returncode == 1, done.output[-3000:]
    assert "longer than the limit of 4194304 bytes" in done.output  # the first failure, also after a failed restart
    assert done.peak_rss < 1 << 30, f"peak RSS {done.peak_rss / 2**20:.0f} MB"
    assert running_processes(tag) == []


# --------------------------------------------------------------------------- depth


def test_deep_json_is_refused_before_decoding() -> None:
    engine = hostile("deep-json")
    with pytest.raises(EngineProtocolError, match=f"JSON nested more than {MAX_DEPTH} deep") as info:
        engine.greedy([1], 1)
    assert "RecursionError" not in str(info.value)
    engine.close(timeout=1.0)


def test_depth_check_judges_structure_not_brackets_in_strings() -> None:
    legit = json.dumps({"type": "hello", "notes": "[" * 10_000 + "{" * 10_000, "deep": [[[[1]]]]})
    assert parse_line(legit)["deep"] == [[[[1]]]]
    nested = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    with pytest.raises(ValueError, match="nested more than"):
        parse_line(nested)
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_line(at_limit) is not None
    with pytest.raises(ValueError, match="4300 digits"):
        parse_line("1" * 5000)


# --------------------------------------------------------------------------- shapes


def _state(shape: list[int], data: bytes) -> dict[str, object]:
    return {
        "type": "state",
        "id": 1,
        "processed": 1,
        "arrays": {"conv_state": {"dtype": "float32", "shape": shape, "data": base64.b64encode(data).decode()}},
    }


def test_an_absurd_state_shape_is_refused_before_allocation() -> None:
    view = WireTargetView(256, 64, "t")
    with pytest.raises(EngineProtocolError, match=r"4 bytes of data for shape \[100000, 100000, 100000\]"):
        view.update(_state([100000, 100000, 100000], b"\0\0\x80\x3f"))
    with pytest.raises(EngineProtocolError, match="dimensions"):
        view.update(_state([1] * 9, b"\0\0\x80\x3f"))
    # the twin: a large consistent shape is accepted and read back exactly
    values = np.arange(2 * 3 * 1000, dtype="<f4")
    view.update(_state([2, 3, 1000], values.tobytes()))
    np.testing.assert_array_equal(view.state_arrays()["conv_state"].ravel(), values)


def test_an_absurd_state_over_the_wire_names_the_request_and_the_first_cause() -> None:
    engine = hostile("absurd-state")
    engine.reset()
    with pytest.raises(EngineProtocolError) as info:
        engine.generate([1, 2], 2)
    assert "request generate #2" in str(info.value) and "for shape [100000, 100000, 100000]" in str(info.value)
    engine.max_restarts = 0
    with pytest.raises(EngineProtocolError) as later:
        engine.generate([1, 2], 2)
    text = str(later.value)
    assert "the first failure: request generate #2" in text and "unusable" not in text
    assert text.count("for shape [100000, 100000, 100000]") == 1
    engine.close(timeout=1.0)


# --------------------------------------------------------------------------- sizes and capacity


def test_a_10_to_the_12_context_handshake_is_a_clear_error() -> None:
    with pytest.raises(EngineProtocolError, match="declares vocab_size=1000000000000, more than the 2147483647"):
        hostile("huge-context")


def test_a_1m_context_engine_is_certified_at_the_profile_capacity(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    spec = exec_spec(HOSTILE, "ok-1m-drafts")
    done = _certify(["engine", "--engine", spec, "--profile", "quick", "--report", str(report)])
    assert done.returncode == 0, done.output[-3000:]
    entry = json.loads(report.read_text())["subjects"]["engines"][0]
    assert entry["capacity"] == {"max_context": 1 << 20, "tested": 4096}
    assert any("capacity tested: contexts up to 4096 tokens" in n and "NOT exercised" in n for n in entry["notes"])
    assert entry["wire"]["generations"] > 0 and entry["wire"]["bytes_received"] > 0  # traffic on the certificate
    assert entry["case"] == "hostile-ok-1m-drafts"  # named by the handshake, not the executable
    assert done.peak_rss < 1 << 30  # and bounded work: the capacity tested is the profile's (4096), not 1M
    # --max-context sets it; a capacity at or above max_context adds no note
    done = _certify(["engine", "--engine", spec, "--profile", "quick", "--max-context", "300", "--report", str(report)])
    assert done.returncode == 0, done.output[-3000:]
    assert json.loads(report.read_text())["subjects"]["engines"][0]["capacity"]["tested"] == 300


def test_a_restart_needs_the_same_handshake(tmp_path: Path) -> None:
    # the engine changes its sizes between starts: the restart is refused naming the field
    flag = tmp_path / "started"
    script = tmp_path / "engine.py"
    script.write_text(
        "import json, sys, pathlib\n"
        f"flag = pathlib.Path({str(flag)!r})\n"
        "first = not flag.exists(); flag.write_text('x')\n"
        "hello = {'type': 'hello', 'protocol': 'specproof-engine/1', 'engine': {'name': 'shifty'},\n"
        "         'vocab_size': 256 if first else 512, 'max_context': 64, 'k': 0, 'rollback': 'replay',\n"
        "         'capabilities': ['greedy']}\n"
        "print(json.dumps(hello), flush=True)\n"
        "for line in sys.stdin:\n"
        "    sys.exit(9)\n"
    )
    engine = ExecEngine([sys.executable, str(script)], timeout=5.0)
    with pytest.raises(EngineProtocolError, match="exited with status 9"):
        engine.greedy([1], 1)
    with pytest.raises(EngineProtocolError, match=r"differs from the first in vocab_size \(256 -> 512\)"):
        engine.greedy([1], 1)
    engine.close(timeout=1.0)


def test_a_tcp_peer_that_drops_the_connection_is_reconnected() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    hello = json.dumps(
        {
            "type": "hello",
            "protocol": "specproof-engine/1",
            "engine": {"name": "dropper"},
            "vocab_size": 256,
            "max_context": 64,
            "k": 0,
            "rollback": "replay",
            "capabilities": ["greedy"],
        }
    )
    import threading

    def serve() -> None:
        for attempt in range(2):
            conn, _ = server.accept()
            with conn:
                conn.sendall(hello.encode() + b"\n")
                rd = conn.makefile("rb")
                req = json.loads(rd.readline())
                if attempt == 0:  # drop the connection mid-request
                    conn.shutdown(socket.SHUT_RDWR)
                    rd.close()
                    continue
                if attempt == 1:  # the second connection answers
                    reply = {
                        "type": "final",
                        "id": req["id"],
                        "tokens": [req["prompt"][-1]],
                        "stop_reason": "max_new_tokens",
                    }
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                    rd.readline()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    engine = TcpEngine("127.0.0.1", port, timeout=5.0)
    with pytest.raises(EngineProtocolError, match="closed the connection before sending final") as info:
        engine.greedy([3], 1)
    assert "dropper (tcp:127.0.0.1:" in str(info.value)
    assert engine.greedy([3], 1) == [3]
    assert engine.restarts == 1
    engine.close()
    thread.join(timeout=5)
    server.close()


@pytest.mark.parametrize(("value", "what"), [(1, "at least 2"), (True, "an integer"), ("9", "an integer")])
def test_max_context_option_is_validated_before_anything_starts(value: object, what: str) -> None:
    from specproof.conformance import Plan
    from specproof.contract import UsageError

    with pytest.raises(UsageError, match=f"--max-context must be {what}"):
        Plan.create("engine", engine="exec:/nonexistent/engine", max_context=value)  # type: ignore[arg-type]


def test_an_honest_engine_without_suite_drafts_is_judged_on_its_own_drafts(tmp_path: Path) -> None:
    """No check fails it; it never drafts, so it is INCONCLUSIVE (exit 3): no speculative round was
    observed, and the verdict names the rollback paths it never took."""
    done = _certify(["engine", "--engine", exec_spec(HOSTILE, "ok"), "--profile", "quick"])
    assert done.returncode == 3, done.output[-3000:]
    assert "INCONCLUSIVE" in done.output and "no speculative round was observed" in done.output
    assert "paths never taken: all_accepted, partial, rejected_at_0" in done.output
    assert "does not take drafts from the suite" not in done.output
