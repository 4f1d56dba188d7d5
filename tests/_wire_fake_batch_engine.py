"""A batched specproof-engine/1 engine that misbehaves on purpose: ``python _wire_fake_batch_engine.py MODE``.

It declares the capability ``batched`` (k = 0: no drafts; every request emits its last prompt token
again, one a step) and answers ``add_request``, ``abort``, ``preempt``, ``reset`` and ``shutdown``
correctly; ``step`` misbehaves as MODE says:

- ``ok``: a correct answer;
- ``no-batch-object``: the handshake names ``batched`` without its ``batch`` object;
- ``unknown-request``: an output for a request that was never added;
- ``not-prefix``: emitted tokens that are not a prefix of the round's accepted ones;
- ``finished-mismatch``: a finished request whose tokens are not the ones its steps emitted;
- ``propose-unknown``: a propose naming a request that is not in the step;
- ``twice``: two outputs for one request in one step.
"""

from __future__ import annotations

import json
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
HELLO: dict[str, object] = {
    "type": "hello",
    "protocol": "specproof-engine/1",
    "engine": {"name": "fake-batch", "version": "0"},
    "vocab_size": 256,
    "max_context": 64,
    "k": 0,
    "rollback": "replay",
    "capabilities": ["greedy", "suite_drafts", "batched"],
    "batch": {"max_batch": 4, "slots": 4, "continuous_arrivals": True, "preemption": ["recompute"]},
}
if MODE == "no-batch-object":
    del HELLO["batch"]


def send(message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def output(name: str, held: dict[str, object], rounds: dict[str, int]) -> dict[str, object]:
    """One step of ``name``: it emits its last prompt token again."""
    prompt, out = held["prompt"], held["out"]
    assert isinstance(prompt, list) and isinstance(out, list)
    token = prompt[-1]
    base = len(prompt) - 1 + len(out)
    record = {"round": rounds[name], "base": base, "draft": [], "argmax": [token], "accepted": [token]}
    record["processed"] = base + 1
    rounds[name] += 1
    out.append(token)
    tokens = [token + 1] if MODE == "not-prefix" else [token]
    done = len(out) >= int(held["max_new_tokens"])  # type: ignore[call-overload]
    finished = {"tokens": out + ([9] if MODE == "finished-mismatch" else []), "stop_reason": "max_new_tokens"}
    return {"request": name, "round": record, "tokens": tokens, "finished": finished if done else None}


def main() -> None:
    send(HELLO)
    held: dict[str, dict[str, object]] = {}
    rounds: dict[str, int] = {}
    for line in sys.stdin:
        req = json.loads(line)
        rid, kind = req["id"], req["type"]
        if kind in ("reset", "shutdown"):
            held.clear()
            send({"type": "ok", "id": rid})
            if kind == "shutdown":
                return
        elif kind == "add_request":
            held[req["request"]] = {**req, "out": []}
            rounds[req["request"]] = 0
            send({"type": "ok", "id": rid})
        elif kind == "preempt":
            send({"type": "ok", "id": rid})
        elif kind == "abort":
            gone = held.pop(req["request"])
            finished = {"tokens": gone["out"], "stop_reason": "error"}
            send(
                {
                    "type": "stepped",
                    "id": rid,
                    "outputs": [{"request": req["request"], "round": None, "tokens": [], "finished": finished}],
                }
            )
        elif kind == "step":
            if MODE == "propose-unknown":
                send({"type": "propose", "id": rid, "round": 0, "context_length": 1, "k": 1, "request": "nobody"})
                continue
            outs = [output(name, h, rounds) for name, h in held.items()]
            if MODE == "unknown-request":
                outs.append({"request": "ghost", "round": None, "tokens": [], "finished": None})
            if MODE == "twice" and outs:
                outs.append({**outs[0], "round": None, "tokens": []})
            for out in outs:
                if out["finished"] is not None:
                    held.pop(str(out["request"]), None)
            send({"type": "stepped", "id": rid, "outputs": outs})
        else:
            send({"type": "error", "id": rid, "message": f"fake batch engine: no {kind}"})


if __name__ == "__main__":
    main()
