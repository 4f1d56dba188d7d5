"""A misbehaving specproof-engine/1 engine for the protocol tests: ``python _wire_fake_engine.py MODE``.

It sends a valid handshake (unless MODE is about the handshake), answers ``reset`` and
``shutdown`` correctly, and misbehaves on ``generate``/``greedy`` as MODE says:

- ``ok``: a trivial correct engine (greedy = repeat the last prompt token; k = 0);
- ``invalid-json``, ``schema-violation``, ``unexpected-message``, ``wrong-id``,
  ``exit-mid-generation``, ``hang``: what the name says, after one valid round record;
- ``noise``: a debug print on stdout after the round record (not JSON);
- ``segv``: killed by SIGSEGV mid-request (``exit-mid-generation`` exits with status 139 instead);
- ``no-state``: advertises ``state`` but sends no state message;
- ``error``: answers every generate with an ``error`` message (and stays usable);
- ``hello-invalid``, ``hello-hang``, ``hello-exit``: the handshake itself is broken;
- ``decode-unkept``: advertises ``penalties``, ``logprobs`` and ``processor_state`` but sends neither
  ``round.processor`` nor ``final.logprobs``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
HELLO = {
    "type": "hello",
    "protocol": "specproof-engine/1",
    "engine": {"name": "fake", "version": "0"},
    "vocab_size": 256,
    "max_context": 64,
    "k": 0,
    "rollback": "replay",
    "capabilities": ["greedy"],
}
if MODE == "no-state":
    HELLO["capabilities"] = ["greedy", "state"]
if MODE == "decode-unkept":
    HELLO["capabilities"] = ["greedy", "penalties", "logprobs", "processor_state"]
if MODE == "future-capabilities":  # a newer engine: capabilities this client has never heard of
    HELLO["capabilities"] = ["greedy", "telepathy", "state_hologram"]


def send(message: object) -> None:
    sys.stdout.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
    sys.stdout.flush()


def main() -> None:
    print(f"fake engine starting in mode {MODE}", file=sys.stderr, flush=True)
    if MODE == "hello-hang":
        time.sleep(3600)
    if MODE == "hello-exit":
        print("fake engine: cannot load weights, giving up", file=sys.stderr, flush=True)
        sys.exit(3)
    send({**HELLO, "k": -1} if MODE == "hello-invalid" else HELLO)
    for line in sys.stdin:
        req = json.loads(line)
        rid = req["id"]
        if req["type"] in ("reset", "shutdown"):
            send({"type": "ok", "id": rid})
            if req["type"] == "shutdown":
                return
            continue
        prompt, n = req["prompt"], req["max_new_tokens"]
        if MODE == "error":
            send({"type": "error", "id": rid, "message": "fake engine: no model loaded"})
            continue
        tokens = [prompt[-1]] * n
        if req["type"] == "generate" and n:
            base = len(prompt) - 1
            send(
                {
                    "type": "round",
                    "id": rid,
                    "round": 0,
                    "base": base,
                    "draft": [],
                    "argmax": [prompt[-1]],
                    "accepted": [prompt[-1]],
                    "processed": base + 1,
                }
            )
        if MODE == "invalid-json":
            send('{"type": "round", "id": ')
        elif MODE == "schema-violation":
            send({"type": "final", "id": rid, "tokens": [-5], "stop_reason": "max_new_tokens"})
        elif MODE == "unexpected-message":
            send(HELLO)
        elif MODE == "wrong-id":
            send({"type": "final", "id": rid + 100, "tokens": tokens, "stop_reason": "max_new_tokens"})
        elif MODE == "exit-mid-generation":
            print("fake engine: segmentation fault (pretend)", file=sys.stderr, flush=True)
            sys.exit(139)
        elif MODE == "hang":
            time.sleep(3600)
        elif MODE == "noise":
            send("debug: round 0 done, 3 tokens in the cache")
        elif MODE == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        else:
            send({"type": "final", "id": rid, "tokens": tokens, "stop_reason": "max_new_tokens"})


if __name__ == "__main__":
    main()
