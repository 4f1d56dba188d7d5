#!/usr/bin/env python3
"""Measure drafters on ``trained``: real-context acceptance, a multi-request session, and proposal cost.

- **real contexts**: the bench's teacher-forced measure (``specproof.bench._real``): at every
  32nd position of held-out test-suite files, each drafter's k-token proposal against the
  target's greedy k+1 tokens; tokens per round and acceptance by position;
- **session**: per held-out file, one drafter instance serves five requests on one
  ``SpecDecoder`` (a prompt, the same prompt again, an edited prompt, it again, a shorter
  prefix); free-running tokens per round by request kind (``suffix`` learns across them,
  ``ngram`` is reset at each);
- **cost**: inside the engine (checkpoint rollback, after the first proposal), the mean wall
  time of a proposal against a verify forward; and the weight bytes a proposal reads against
  a target step (the heads read their weights and the target's tied LM head once per step).

    python scripts/measure_drafters.py --json /tmp/drafters.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from specproof.bench._real import measure_real_contexts, real_context_texts
from specproof.engine import SpecDecoder
from specproof.plugins import load_drafter, load_target

DRAFTERS = ("ngram", "model:trained-small", "combined:trained-small", "eagle:trained", "mtp:trained", "suffix")


class _Timed:
    """Times ``propose`` (drafter) or the forwards (target); everything else passes through."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in ("propose", "forward", "forward_with_checkpoints", "forward_with_features"):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        return timed

    @property
    def processed(self) -> int:
        return int(self.inner.processed)


def _weight_bytes(spec: str, target_bytes: int, k: int) -> float | None:
    """Weight bytes a k-token proposal reads, as a multiple of a target step's (None: no model)."""
    if spec.startswith(("model:", "combined:")):
        model = load_target(spec.partition(":")[2])
        return k * sum(v.nbytes for v in model.weights.values()) / target_bytes  # type: ignore[attr-defined]
    if spec.startswith(("eagle:", "mtp:")):
        head = load_drafter(spec).head  # type: ignore[attr-defined]
        return k * (4 * head.parameters + head.embed.nbytes) / target_bytes
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    t0 = time.time()
    out: dict[str, Any] = {"load_before": os.getloadavg(), "k": args.k}
    texts = real_context_texts(files=args.files, text_tokens=args.tokens, stride=32, min_prefix=128)
    cells = measure_real_contexts(
        "trained", load_target("trained"), [(s, lambda s=s: load_drafter(s)) for s in DRAFTERS], texts, k=args.k
    )
    out["real_contexts"] = [c.to_json() for c in cells]
    for c in cells:
        acc = ", ".join(f"{a:.2f}" for a in c.acceptance_by_position)
        print(f"real   {c.drafter:24s} {c.positions} positions  tokens/round {c.tokens_per_round:.3f}  [{acc}]")
    session_texts = texts[:3]
    out["session"] = {}
    for spec in ("ngram", "suffix"):
        totals: dict[str, list[int]] = {}
        for text in session_texts:
            base = list(text.tokens[:400])
            edited = [*base[:200], *b"spam", *base[204:]]
            dec = SpecDecoder(load_target("trained"), load_drafter(spec), k=args.k, rollback="checkpoint")
            for kind, prompt in (("new", base), ("repeat", base), ("edited", edited), ("repeat-edited", edited),
                                 ("prefix", base[:300])):
                gen = dec.generate(prompt, 96)
                assert gen.stats is not None
                row = totals.setdefault(kind, [0, 0])
                row[0] += gen.stats.rounds
                row[1] += len(gen.tokens)
        out["session"][spec] = {kind: round(e / r, 3) for kind, (r, e) in totals.items()}
        print(f"session {spec:8s} tokens/round by request: {out['session'][spec]}")
    target_bytes = sum(v.nbytes for v in load_target("trained").weights.values())  # type: ignore[attr-defined]
    out["cost"] = {}
    for spec in DRAFTERS:
        drafter_s = verify_s = 0.0
        proposals = verifies = 0
        for text in texts[:4]:
            drafter, target = _Timed(load_drafter(spec)), _Timed(load_target("trained"))
            session = SpecDecoder(target, drafter, k=args.k, rollback="checkpoint").start(list(text.tokens[:512]))  # type: ignore[arg-type]
            session.generate(1, max_rounds=1)  # the first proposal catches up on the whole prompt: not counted
            drafter.seconds = target.seconds = 0.0
            drafter.calls = target.calls = 0
            session.generate(96)
            drafter_s += drafter.seconds
            verify_s += target.seconds
            proposals += drafter.calls
            verifies += target.calls
        row = {
            "proposal_ms": round(1000 * drafter_s / max(proposals, 1), 3),
            "verify_ms": round(1000 * verify_s / max(verifies, 1), 3),
            "wall_ratio": round((drafter_s / max(proposals, 1)) / (verify_s / max(verifies, 1)), 3),
            "weight_bytes_ratio": _weight_bytes(spec, target_bytes, args.k),
        }
        out["cost"][spec] = row
        print(f"cost   {spec:24s} {row}")
    out["load_after"] = os.getloadavg()
    out["seconds"] = round(time.time() - t0, 1)
    print(f"load {out['load_before'][0]:.2f} -> {out['load_after'][0]:.2f}; {out['seconds']} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
