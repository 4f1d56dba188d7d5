"""Protocol overhead of specproof-engine/1 for the native engine (prints JSON).

    python native/measure_protocol.py [ENGINE_BINARY] [WEIGHTS]

For each configuration, one generation on a bench prompt through ``ExecEngine``: the
client's wall time minus the engine's own ``elapsed_us`` (the engine's compute, waits
for drafts excluded), per round. Configurations: the engine's own drafter without state
dumps (the bare pipe), suite drafts (one ``propose``/``draft`` round trip per round), and
suite drafts with state dumps (the certify setting: KV, conv and rec state every round).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from specproof.bench._workloads import build_workloads
from specproof.engine import NgramDrafter
from specproof.wire import ExecEngine
from specproof.wire.native import native_binary


def main() -> None:
    binary = sys.argv[1] if len(sys.argv) > 1 else str(native_binary())
    weights = sys.argv[2] if len(sys.argv) > 2 else str(native_binary().parent / "trained.safetensors")
    out: dict[str, object] = {}
    for name in ("code-edit", "free-text"):
        prompt = list(build_workloads([name], prompt_chars=400)[0].text.encode())
        for label, drafts, state in (
            ("own-drafts", False, False),
            ("suite-drafts", True, False),
            ("suite+state", True, True),
        ):
            with ExecEngine([binary, "--weights", weights], state=state) as engine:
                per_round = []
                for _ in range(5):
                    engine.reset()
                    engine.drafter = NgramDrafter() if drafts else None
                    start = time.perf_counter()
                    gen = engine.generate(prompt, 128)
                    wall = (time.perf_counter() - start) * 1e6
                    assert gen.stats is not None and engine.last_elapsed_us is not None
                    drafter_us = 0.0  # the Python drafter's time is neither protocol nor engine; measured apart
                    if drafts:
                        d = NgramDrafter()
                        ctx = list(prompt)
                        t = time.perf_counter()
                        for step in gen.steps or ():
                            d.propose(ctx, engine.k)
                            ctx.extend(step.accepted)
                        drafter_us = (time.perf_counter() - t) * 1e6
                    per_round.append((wall - engine.last_elapsed_us - drafter_us) / gen.stats.rounds)
                out[f"{name}/{label}"] = {
                    "rounds": gen.stats.rounds,
                    "overhead_us_per_round_median": round(statistics.median(per_round), 1),
                    "engine_decode_us_per_round": round(
                        (engine.last_elapsed_us - (engine.last_prefill_us or 0)) / gen.stats.rounds, 1
                    ),
                }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
