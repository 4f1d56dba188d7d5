"""The on-device host loop of docs/swift-engine.md ("The multifunction host loop"), transcribed to Python.

The Swift text and this module name the same steps (``HOST_LOOP_STEPS``; a test holds them in step):
``load_functions`` (one evaluator per function of the package: ``decode`` q = 1, ``verify`` q = K + 1),
``make_state`` (one set of states, threaded through every call), ``position_inputs`` (``position [1]``
or the seed's ``position_ids [1, processed + q]``), ``chunk_step`` (one call of the function whose fixed
shape is the chunk's), ``feed`` (verify calls while K + 1 tokens remain, then decode calls: the prefill
and the replay), ``snapshot`` / ``restore`` (the conv and recurrent states and ``processed``; the KV cache
is append-only, rolled back by moving ``processed``), ``verify_round`` (the pending token and the drafts
in one forward, every row read) and ``generate`` (the round loop: accept rule, restore-and-replay).

It drives the bundle through the ML-program evaluator (``MilEvaluator``, the program as saved), so a
Linux machine runs the loop a Mac runs through Core ML, and its ``Generation`` (per-round ``Step``
records) is written as a trace in the trace format (``specproof.formats.trace``) that ``specproof check-trace`` judges
(``specproof bundle host-loop``). What it cannot show is Core ML's own kernels: that needs the Swift
engine on a Mac, over ``specproof-engine/1``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs
import numpy as np

from specproof.contract import Drafter, Generation, Step, StopReason
from specproof.contract.errors import InvalidSettingError
from specproof.engine.targets.mil_eval import MilEvaluator, load_program

__all__ = ["HOST_LOOP_BUGS", "HOST_LOOP_STEPS", "HostLoop", "HostSnapshot", "load_functions"]

#: the steps of the loop, as the Swift text names them (camelCase there)
HOST_LOOP_STEPS: Final = (
    "load_functions",
    "make_state",
    "position_inputs",
    "chunk_step",
    "feed",
    "snapshot",
    "restore",
    "verify_round",
    "generate",
)
#: TEST-ONLY broken loops: ``no-restore`` moves ``processed`` back after a rejection but keeps the conv and
#: recurrent states the rejected drafts left (the replay then starts from them).
HOST_LOOP_BUGS: Final = ("no-restore",)
_KV: Final = ("key_cache", "value_cache", "kv_cache")


def load_functions(path: str | Path) -> dict[int, MilEvaluator]:
    """Token count -> the function that takes exactly that many (``decode`` 1, ``verify`` K + 1)."""
    program = load_program(path)
    out: dict[int, MilEvaluator] = {}
    for name in program.functions:
        ev = MilEvaluator(path, function=name, program=program)
        shape = ev.input_specs.get("input_ids", ((),))[0]
        if len(shape) != 2 or not isinstance(shape[1], (int, np.integer)):
            raise InvalidSettingError(
                f"bundle host-loop {str(path)!r}: function {name!r} has input_ids {list(shape)}; the host loop "
                "feeds fixed shapes (export with --multifunction)"
            )
        out[int(shape[1])] = ev
    if 1 not in out or len(out) < 2:
        raise InvalidSettingError(
            f"bundle host-loop {str(path)!r}: needs a decode function (1 token) and a verify function "
            f"(K + 1 tokens), got token counts {sorted(out)}"
        )
    return out


@attrs.frozen(eq=False)
class HostSnapshot:
    """What a rollback restores: the conv and recurrent states (copies) and ``processed``."""

    processed: int
    states: dict[str, np.ndarray]


class HostLoop:
    """The round loop over a multifunction bundle: ``generate(prompt, max_new_tokens)`` -> ``Generation``."""

    def __init__(self, path: str | Path, drafter: Drafter, *, _bug: str | None = None) -> None:
        if _bug not in (None, *HOST_LOOP_BUGS):
            raise InvalidSettingError(f"HostLoop: _bug={_bug!r}; one of {', '.join(HOST_LOOP_BUGS)}")
        self.path = Path(path)
        self.functions = load_functions(path)
        self.k = max(self.functions) - 1
        self.drafter = drafter
        self.bug = _bug
        decode = self.functions[1]
        self.positions = "seed" if "position_ids" in decode.input_specs else "scalar"
        outs = set(decode.output_names)
        self.io_states = [n for n in decode.input_specs if f"{n}_out" in outs]
        self.max_context = self._max_context(decode)
        self.vocab_size = 0
        self.calls: Counter[str] = Counter()
        self.processed = 0
        self.make_state()

    @staticmethod
    def _max_context(decode: MilEvaluator) -> int:
        shapes = decode.state_shapes
        if "kv_cache" in shapes:
            return int(shapes["kv_cache"][3])
        if "key_cache" in shapes:
            return int(shapes["key_cache"][2])
        raise InvalidSettingError(f"bundle host-loop: function {decode.function!r} has no key_cache or kv_cache")

    def make_state(self) -> None:
        """One set of zero states (``makeState()``): the MLStates every function reads and writes, the
        input/output states passed in and taken back; ``processed = 0``."""
        decode = self.functions[1]
        decode.reset()
        self.mlstate = decode.states
        self.io = {n: np.zeros(decode.input_specs[n][0], np.float16) for n in self.io_states}
        self.processed = 0

    def position_inputs(self, processed: int, q: int) -> dict[str, np.ndarray]:
        """``position [processed]``, or the seed's ``position_ids [0 ..< processed + q]``."""
        if self.positions == "seed":
            return {"position_ids": np.arange(processed + q, dtype=np.int32)[None]}
        return {"position": np.array([processed], np.int32)}

    def chunk_step(self, tokens: Sequence[int]) -> np.ndarray:
        """One call of the function of ``len(tokens)`` tokens at ``processed``: its logits rows ``[q, vocab]``."""
        fn = self.functions[len(tokens)]
        fn.states = self.mlstate  # the one state, threaded through whichever function runs
        self.calls[fn.function] += 1
        ids = np.array([list(tokens)], np.int32)
        out = fn(input_ids=ids, **self.position_inputs(self.processed, len(tokens)), **self.io)
        for name in self.io_states:
            self.io[name] = np.asarray(out[f"{name}_out"], np.float16).copy()
        self.processed += len(tokens)
        return np.asarray(out["logits"], np.float32)[0]

    def feed(self, tokens: Sequence[int]) -> np.ndarray:
        """``tokens`` through verify calls while K + 1 remain, then decode calls (prefill, replay): all rows."""
        rows, start, verify = [], 0, self.k + 1
        while start < len(tokens):
            size = verify if len(tokens) - start >= verify else 1
            rows.append(self.chunk_step(tokens[start : start + size]))
            start += size
        return np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)

    def snapshot(self) -> HostSnapshot:
        """The conv and recurrent states (MLState or input/output) and ``processed``; not the KV cache."""
        states = {n: v.copy() for n, v in (*self.mlstate.items(), *self.io.items()) if n not in _KV}
        return HostSnapshot(processed=self.processed, states=states)

    def restore(self, snapshot: HostSnapshot) -> None:
        """Put the snapshot's states back and move ``processed`` (stale KV slots are overwritten later)."""
        if self.bug != "no-restore":
            for name, value in snapshot.states.items():
                (self.io if name in self.io else self.mlstate)[name] = value.copy()
        self.processed = snapshot.processed

    def verify_round(self, pending: int, draft: Sequence[int]) -> tuple[list[int], list[int]]:
        """The pending token and the drafts in one forward (``verify``; a shorter round through ``decode``):
        ``(fed, argmax)``, the argmax of every row, the lowest id on ties."""
        fed = [int(pending), *(int(t) for t in draft)]
        rows = self.feed(fed)
        self.vocab_size = int(rows.shape[-1])
        return fed, [int(np.argmax(row)) for row in rows]

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, eos_token_id: int | None = None) -> Generation:
        """Greedy speculative decoding of ``prompt``: prefill all but its last token, then rounds of drafts
        verified in one forward, the accept rule, and restore-and-replay of the kept tokens on a rejection."""
        if not prompt or max_new_tokens < 0 or len(prompt) > self.max_context:
            raise InvalidSettingError(
                f"bundle host-loop: a prompt of 1..{self.max_context} tokens and max_new_tokens >= 0, got "
                f"{len(prompt)} tokens and {max_new_tokens}"
            )
        self.make_state()
        self.feed([int(t) for t in prompt[:-1]])  # the last prompt token is pending
        ctx, out, steps = [int(t) for t in prompt], list[int](), list[Step]()
        stop: StopReason = "max_new_tokens"
        while len(out) < max_new_tokens:
            room = self.max_context - self.processed
            if room < 1:
                stop = "context_full"
                break
            remaining = max_new_tokens - len(out)
            k_eff = min(self.k, remaining - 1, room - 1)
            draft = [int(t) for t in self.drafter.propose(ctx, k_eff)][:k_eff] if k_eff > 0 else []
            base, saved = self.processed, self.snapshot()
            fed, argmax = self.verify_round(ctx[-1], draft)
            j = 0
            while j < len(draft) and draft[j] == argmax[j]:
                j += 1
            accepted = [*draft[:j], argmax[j]]
            emitted = accepted[:remaining]
            if eos_token_id is not None and eos_token_id in emitted:
                emitted = emitted[: emitted.index(eos_token_id) + 1]
            if len(emitted) < len(fed):  # a rejection (or a truncation): restore, then replay the kept tokens
                self.restore(saved)
                self.feed(fed[: len(emitted)])
            steps.append(Step(base=base, draft=draft, argmax=argmax, accepted=accepted, processed=self.processed))
            ctx += emitted
            out += emitted
            if eos_token_id is not None and emitted[-1] == eos_token_id:
                stop = "eos"
                break
        return Generation(tokens=out, stop_reason=stop, steps=tuple(steps))
