"""A hung sampled generate is bounded by one stated timeout, with progress shown (issue 35, faults).

The engine (the correct ``_wire_py_engine.py sampling`` behind a proxy) answers every request but a
sampled ``generate``, on which it hangs for ever. With ``$SPECPROOF_WIRE_TIMEOUT`` (the one bound on
a wire engine's answer) the sampled search asks it once: the checks fail on that timeout, naming it,
and while it waits ``certify`` prints a line saying what it waits for and the bound. (Before, the
search asked again for each of 9 restarts, 9 x 60 s at the default, with nothing printed.)
Nothing here is timed: the proxy counts the sampled requests it was sent. The bound is 20 s, not a
few: it bounds the handshake too, and two Python processes starting beside two CPU burners once took
over 3 s to say hello (tox at load 6).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a certify process and an engine process

TESTS = Path(__file__).resolve().parents[1]

PROXY = textwrap.dedent(
    """
    import json, subprocess, sys, threading, time
    child = subprocess.Popen([sys.executable, sys.argv[1], "sampling"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, bufsize=1)

    def pump():
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()

    threading.Thread(target=pump, daemon=True).start()
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("type") == "generate" and (msg.get("sampling") or {}).get("temperature"):
            with open(sys.argv[2], "a") as f:
                f.write("sampled generate\\n")
            while True:  # hung on a sampled request, for ever
                time.sleep(1)
        child.stdin.write(line)
        child.stdin.flush()
    """
)


TIMEOUT = 20  # seconds: the handshake's bound too (see above)


def test_a_hung_sampled_generate_is_asked_once_and_waited_for_aloud(tmp_path: Path) -> None:
    proxy, marks, report = tmp_path / "proxy.py", tmp_path / "sampled-requests", tmp_path / "r.json"
    proxy.write_text(PROXY)
    spec = "exec:" + shlex.join([sys.executable, str(proxy), str(TESTS / "_wire_py_engine.py"), str(marks)])
    env = {**os.environ, "SPECPROOF_WIRE_TIMEOUT": str(TIMEOUT), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent / "src"), env.get("PYTHONPATH", "")])
    args = ["certify", "engine", "--engine", spec, "--sampling", "temperature=0.8", "--only", "engine.sampled-*"]
    args += ["--db", "none", "--hypothesis-dir", str(tmp_path / "hyp"), "--report", str(report)]
    done = subprocess.run(
        [sys.executable, "-m", "specproof", *args], env=env, capture_output=True, text=True, timeout=600
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 1, printed[-3000:]
    assert marks.read_text().count("sampled generate") == 1, printed[-3000:]  # asked once, not once per restart
    waiting = [line for line in printed.splitlines() if line.startswith("waiting for a sampled generation")]
    assert waiting, printed[-3000:]
    assert waiting[0].endswith(
        f"(an exec:/tcp: engine that does not answer within $SPECPROOF_WIRE_TIMEOUT = {TIMEOUT} s fails, and is "
        "not asked again in this search)"
    ), waiting[0]
    results = json.loads(report.read_text())["results"]
    assert results and all(r["status"] == "fail" for r in results), [(r["id"], r["status"]) for r in results]
    assert all(f"timed out after {TIMEOUT} s" in (r["detail"] or "") for r in results), [r["detail"] for r in results]
    assert "Traceback" not in printed
