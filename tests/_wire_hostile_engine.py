"""A hostile specproof-engine/1 engine for the bounds tests: ``python _wire_hostile_engine.py MODE [--tcp]``.

With ``--tcp`` it listens on 127.0.0.1 (an ephemeral port, printed to stdout as ``PORT N``)
and serves one connection; else it speaks on its stdio. Modes:

- ``ok``: a correct engine of k = 0 whose model repeats the last token (capability
  ``greedy``); ``ok-1m`` is the same with ``max_context`` = 1,048,576; ``ok-drafts`` and
  ``ok-1m-drafts`` have k = 3 and take the suite's drafts (``suite_drafts``);
- ``flood``: after the handshake, answers a request with an endless line (no newline);
- ``flood-hello``: the handshake itself never ends;
- ``huge-context`` (``huge-context-drafts``: with k = 3 and ``suite_drafts``): a handshake with
  ``max_context`` and ``vocab_size`` of 10**12;
- ``deep-json``: answers a request with 200,000 ``[``;
- ``ignore-drafts`` / ``swap-drafts`` (k = 3, ``suite_drafts``): never asks for the suite's
  draft (verifies its own), or asks and then verifies its own draft instead;
- ``absurd-state``: capability ``state``; the first state message has shape
  ``[100000, 100000, 100000]`` with 4 bytes of data.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import IO

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
TCP = "--tcp" in sys.argv[2:]
HELLO: dict[str, object] = {
    "type": "hello",
    "protocol": "specproof-engine/1",
    "engine": {"name": f"hostile-{MODE}", "version": "0"},
    "vocab_size": 256,
    "max_context": 64,
    "k": 0,
    "rollback": "replay",
    "capabilities": ["greedy"],
}
if MODE.startswith("ok-1m"):
    HELLO["max_context"] = 1 << 20
if MODE.endswith("drafts") or MODE in ("ignore-drafts", "swap-drafts"):
    HELLO["k"] = 3
    HELLO["capabilities"] = ["greedy", "suite_drafts"]
if MODE.startswith("huge-context"):
    HELLO["max_context"] = HELLO["vocab_size"] = 10**12
if MODE == "absurd-state":
    HELLO["capabilities"] = ["greedy", "state"]


def serve(rd: IO[str], wr: IO[str]) -> None:
    def send(message: object) -> None:
        wr.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
        wr.flush()

    if MODE == "flood-hello":
        chunk = "x" * 65536
        while True:
            wr.write(chunk)
    send(HELLO)
    for line in rd:
        req = json.loads(line)
        rid = req["id"]
        if req["type"] in ("reset", "shutdown"):
            send({"type": "ok", "id": rid})
            if req["type"] == "shutdown":
                return
            continue
        if MODE == "flood":
            chunk = f'{{"type":"state","id":{rid},"arrays":"' + "A" * 65536
            while True:
                wr.write(chunk)
                chunk = "A" * 65536
        if MODE == "deep-json":
            send("[" * 200_000)
            continue
        prompt, n, eos = req["prompt"], req["max_new_tokens"], req.get("eos_token_id")
        if req["type"] == "generate" and (MODE.endswith("drafts") or MODE in ("ignore-drafts", "swap-drafts")):
            speculate(req, send, rd)
            continue
        last = prompt[-1]
        room = int(HELLO["max_context"]) - len(prompt) + 1  # type: ignore[call-overload]
        count = min(n, max(0, room))
        tokens: list[int] = []
        for _ in range(count):
            tokens.append(last)
            if last == eos:
                break
        stop = "eos" if tokens and tokens[-1] == eos else ("max_new_tokens" if len(tokens) == n else "context_full")
        if req["type"] == "generate":
            processed = len(prompt) - 1
            for r, tok in enumerate(tokens):
                if req.get("state") and MODE == "absurd-state":
                    send(
                        {
                            "type": "state",
                            "id": rid,
                            "processed": processed,
                            "arrays": {
                                "conv_state": {
                                    "dtype": "float32",
                                    "shape": [100000, 100000, 100000],
                                    "data": "AACAPw==",
                                }
                            },
                        }
                    )
                send(
                    {
                        "type": "round",
                        "id": rid,
                        "round": r,
                        "base": processed,
                        "draft": [],
                        "argmax": [tok],
                        "accepted": [tok],
                        "processed": processed + 1,
                    }
                )
                processed += 1
        send({"type": "final", "id": rid, "tokens": tokens, "stop_reason": stop})


def speculate(req: dict[str, object], send: object, rd: IO[str]) -> None:
    """Speculative decoding of the repeat-the-last-token model, drafts from the suite or its own."""
    rid, ctx = req["id"], list(req["prompt"])  # type: ignore[call-overload]
    n, eos, cap, k = req["max_new_tokens"], req.get("eos_token_id"), int(HELLO["max_context"]), int(HELLO["k"])  # type: ignore[call-overload]
    emitted: list[int] = []
    processed, r, stop = len(ctx) - 1, 0, "max_new_tokens"
    while len(emitted) < n:  # type: ignore[operator]
        if processed >= cap:
            stop = "context_full"
            break
        k_eff = max(0, min(k, n - len(emitted) - 1, cap - processed - 1))  # type: ignore[operator]
        draft: list[int] = [ctx[-1]] * k_eff
        if k_eff and req["drafts"] == "suite" and MODE != "ignore-drafts":
            send({"type": "propose", "id": rid, "round": r, "context_length": len(ctx), "k": k_eff})  # type: ignore[operator]
            answer = json.loads(rd.readline())
            if answer["type"] != "draft":
                send({"type": "error", "id": rid, "message": "abandoned"})  # type: ignore[operator]
                return
            draft = answer["tokens"][:k_eff] if MODE != "swap-drafts" else [ctx[-1]] * k_eff
            # the hostile-drafter rule (docs/contract.md): cut a draft before an id outside the vocabulary
            bad = [i for i, t in enumerate(draft) if not 0 <= t < HELLO["vocab_size"]]  # type: ignore[operator]
            draft = draft[: bad[0]] if bad else draft
        argmax = [ctx[-1], *draft]
        j = 0
        while j < len(draft) and draft[j] == argmax[j]:
            j += 1
        accepted = [*draft[:j], argmax[j]]
        kept = accepted[: n - len(emitted)]  # type: ignore[operator]
        if eos in kept:
            kept = kept[: kept.index(eos) + 1]
        base = processed
        processed = base + len(kept)  # rolled back past any token after EOS
        send(
            {
                "type": "round",
                "id": rid,
                "round": r,
                "base": base,
                "draft": draft,
                "argmax": argmax,  # type: ignore[operator]
                "accepted": accepted,
                "processed": processed,
            }
        )
        r += 1
        emitted += kept
        ctx += kept
        if kept[-1] == eos:
            stop = "eos"
            break
    send({"type": "final", "id": rid, "tokens": emitted, "stop_reason": stop})  # type: ignore[operator]


def main() -> None:
    print(f"hostile engine starting in mode {MODE}", file=sys.stderr, flush=True)
    if not TCP:
        serve(sys.stdin, sys.stdout)
        return
    server = socket.create_server(("127.0.0.1", 0))
    print(f"PORT {server.getsockname()[1]}", flush=True)
    conn, _ = server.accept()
    with conn, conn.makefile("r", encoding="utf-8") as rd, conn.makefile("w", encoding="utf-8") as wr:
        try:
            serve(rd, wr)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass


if __name__ == "__main__":
    main()
