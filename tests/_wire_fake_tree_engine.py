"""A specproof-engine/1 engine with capability ``trees`` for the client's tree tests:
``python _wire_fake_tree_engine.py MODE``.

Its model repeats the last token (greedy: the pending token forever), so the greedy tree rule is simple:
a node matches when its token equals its parent's (a root: the pending token's). It asks for every draft
as a tree (``propose.max_nodes``), keeps no state and misbehaves as MODE says:

- ``ok``: correct;
- ``other-tree``: reports a tree other than the one the suite sent on its ``round``;
- ``no-path``: a ``round`` without ``path``;
- ``no-max-nodes``: a ``propose`` without ``max_nodes`` in a tree request;
- ``short-argmax``: an ``argmax`` one row short;
- ``final-tokens``: a ``final`` whose tokens are not the rounds' emitted tokens.
"""

from __future__ import annotations

import json
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
K = 3
HELLO = {
    "type": "hello",
    "protocol": "specproof-engine/1",
    "engine": {"name": "fake-trees", "version": "0"},
    "vocab_size": 256,
    "max_context": 64,
    "k": K,
    "rollback": "replay",
    "capabilities": ["greedy", "suite_drafts", "trees"],
}


def send(message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def read() -> dict:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def generate(req: dict) -> None:
    rid, ctx, n = req["id"], list(req["prompt"]), req["max_new_tokens"]
    tree = req.get("tree")
    out: list[int] = []
    processed = len(ctx) - 1
    round_ = 0
    while len(out) < n:
        k_eff = min(K, n - len(out) - 1)
        tokens: list[int] = []
        parents: list[int] = []
        if k_eff > 0:
            propose = {"type": "propose", "id": rid, "round": round_, "context_length": len(ctx), "k": k_eff}
            if tree and MODE != "no-max-nodes":
                propose["max_nodes"] = tree["max_nodes"]
            send(propose)
            draft = read()
            if draft["type"] != "draft":
                send({"type": "error", "id": rid, "message": "expected a draft message in answer to propose"})
                return
            tokens, parents = draft["tokens"], draft.get("parents", list(range(-1, len(draft["tokens"]) - 1)))
        # the model repeats the last token: the argmax after a node is its own token
        argmax = [ctx[-1], *tokens]
        depth, matched, best = [0] * len(tokens), [False] * len(tokens), -1
        for i, p in enumerate(parents):
            depth[i] = 1 if p < 0 else depth[p] + 1
            if (p < 0 or matched[p]) and tokens[i] == argmax[p + 1]:
                matched[i] = True
                if best < 0 or depth[i] > depth[best]:
                    best = i
        path: list[int] = []
        walk = best
        while walk >= 0:
            path.insert(0, walk)
            walk = parents[walk]
        accepted = [*(tokens[i] for i in path), argmax[best + 1]]
        emitted = accepted[: n - len(out)]
        processed += len(emitted)
        record = {
            "type": "round",
            "id": rid,
            "round": round_,
            "base": processed - len(emitted),
            "draft": tokens,
            "parents": parents,
            "argmax": argmax[:-1] if MODE == "short-argmax" else argmax,
            "accepted": accepted,
            "path": path,
            "processed": processed,
        }
        if MODE == "other-tree" and tokens:
            record["draft"] = [(tokens[0] + 1) % 256, *tokens[1:]]
        if MODE == "no-path":
            del record["path"]
        send(record)
        out.extend(emitted)
        ctx.extend(emitted)
        round_ += 1
    tokens_out = [*out, 0] if MODE == "final-tokens" else out
    send({"type": "final", "id": rid, "tokens": tokens_out, "stop_reason": "max_new_tokens", "processed": processed})


def main() -> None:
    send(HELLO)
    while True:
        req = read()
        rid = req["id"]
        if req["type"] in ("reset", "shutdown"):
            send({"type": "ok", "id": rid})
            if req["type"] == "shutdown":
                return
        elif req["type"] == "greedy":
            send(
                {
                    "type": "final",
                    "id": rid,
                    "tokens": [req["prompt"][-1]] * req["max_new_tokens"],
                    "stop_reason": "max_new_tokens",
                }
            )
        elif req["type"] == "generate":
            generate(req)


if __name__ == "__main__":
    main()
