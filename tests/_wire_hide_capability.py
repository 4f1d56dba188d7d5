"""An older engine, for the meta-tests: ``python _wire_hide_capability.py CAPABILITY CMD...`` runs the engine
``CMD`` and relays its stdio unchanged, except that its ``hello`` no longer declares ``CAPABILITY`` (an engine
built before that capability, as the suite sees it)."""

from __future__ import annotations

import json
import subprocess
import sys


def main() -> int:
    hidden, command = sys.argv[1], sys.argv[2:]
    with subprocess.Popen(command, stdin=sys.stdin, stdout=subprocess.PIPE, text=True) as engine:
        assert engine.stdout is not None
        first = True
        for line in engine.stdout:
            if first:
                hello = json.loads(line)
                hello["capabilities"] = [c for c in hello.get("capabilities", []) if c != hidden]
                line = json.dumps(hello) + "\n"
                first = False
            sys.stdout.write(line)
            sys.stdout.flush()
    return engine.returncode


if __name__ == "__main__":
    raise SystemExit(main())
