"""``CoreMLEvalTarget``: a ``Target`` over a saved Core ML bundle, run by the numpy ML-program evaluator.

``coreml-eval:PATH[,tie_tolerance=X]`` certifies a bundle on Linux: the program stored in
the ``.mlpackage`` is executed op by op (``mil_eval.MilEvaluator``: fp16 storage, fp32
accumulation, only the ops it implements; any other op is an ``UnknownOpError`` naming the
op and the program). The interface is the one ``specproof bundle export`` writes and
``bundle inspect`` qualifies: ``input_ids`` int32 ``[1, q]``, ``position`` int32 ``[1]`` (or the seed's
``position_ids`` int32 ``[1, processed + q]``, fed ``0 ..< processed + q``), ``logits`` ``[1, q, vocab]``;
the states either all Core ML states (``all-mlstate``) or the KV cache as states with the other states as
input/output pairs ``NAME`` -> ``NAME_out`` (``kv-mlstate``), or as ``kv-mlstate`` with keys and values in
one state ``kv_cache`` ``[2, ...]`` (``unified-kv``); all are threaded from call to call here.

``snapshot``/``restore`` copy every state (fp16). ``forward_with_checkpoints`` returns
the logits of the one chunked forward and, as checkpoints, the states the evaluator reaches
replaying the chunk one position at a time from the same start (a bundle returns no
per-position states). ``tie_tolerance`` defaults to ``FP16_TIE_TOLERANCE``.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
import numpy.typing as npt

from specproof.contract.errors import CapacityError, InvalidSettingError, TargetContractError, TokenRangeError
from specproof.engine.targets.mil_eval import OPS, MilEvaluator, UnknownOpError, load_program

__all__ = [
    "FP16_TIE_TOLERANCE",
    "OPS",
    "SOURCE_ROUTER_MARGIN",
    "SOURCE_RTOL",
    "CoreMLEvalSnapshot",
    "CoreMLEvalTarget",
    "UnknownOpError",
    "load_spec",
]

#: logit tolerance for an fp16 bundle: logits of magnitude 16..32 (the flagship bundles reach ~23) have an
#: fp16 spacing of 2^-5; q=1 and q=K+1 kernels on a device may round a few ops differently: 4 spacings.
FP16_TIE_TOLERANCE: Final = 0.125
#: against its float32 source (``certify target --oracle``, ``bundle check``): a row may differ by this fraction of
#: its largest |source logit| (fp16 error is ~1.5%; drawn sequences reach 14-17% near router ties: docs/coreml.md)
SOURCE_RTOL: Final = 0.25
#: rows from the first position where the source's router margin is below this are not compared: fp16 may route
#: them otherwise (docs/coreml.md, "Router near-ties")
SOURCE_ROUTER_MARGIN: Final = 0.5
_OPTIONS: Final = ("tie_tolerance", "source_rtol", "source_router_margin")
KV_STATES: Final = ("key_cache", "value_cache")
#: the position layout -> its input (``position [1]`` or the seed's ``position_ids [1, processed + q]``)
POSITION_INPUTS: Final = {"scalar": "position", "seed": "position_ids"}
UNIFIED_KV: Final = "kv_cache"  # one KV state [2, layers, kv_heads, max_context, head_dim]: keys, then values
PARENTS: Final = "parents"  # the input that makes a function a tree function (coreml_eval_tree), not a chain one


@attrs.frozen(eq=False)
class CoreMLEvalSnapshot:
    """Every state (fp16 copies) and ``processed`` of a ``CoreMLEvalTarget``."""

    processed: int
    states: dict[str, npt.NDArray[np.float16]] = attrs.field(repr=lambda s: f"<{', '.join(s)}>")
    target_id: int = attrs.field(repr=False)


def _meta_int(meta: dict[str, str], key: str, path: Path) -> int | None:
    value = meta.get(f"specproof.{key}")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidSettingError(
            f"coreml-eval {str(path)!r}: metadata specproof.{key}={value!r} is not an integer"
        ) from None


class CoreMLEvalTarget:
    """A ``Target`` (white-box, with checkpoints) over a saved ``.mlpackage``, evaluated in numpy on any OS."""

    _ids = iter(range(1, 1 << 62))

    def __init__(
        self,
        path: str | Path,
        *,
        tie_tolerance: float | None = None,
        source_rtol: float = SOURCE_RTOL,
        source_router_margin: float = SOURCE_ROUTER_MARGIN,
    ) -> None:
        p = Path(path)
        if not p.exists():
            raise InvalidSettingError(f"coreml-eval: {str(p)!r} does not exist")
        self.path = p
        self._ev, self._fixed = _functions(p)
        ev = self._ev
        outs = set(ev.output_names)
        #: ``scalar``: ``position [1]`` = processed; ``seed``: ``position_ids [1, processed + q]`` = 0 ..< processed + q
        self.positions = "seed" if "position_ids" in ev.input_specs else "scalar"
        self._position_input = POSITION_INPUTS[self.positions]
        missing = [n for n in ("input_ids", self._position_input) if n not in ev.input_specs]
        if missing or "logits" not in outs:
            raise InvalidSettingError(
                f"coreml-eval {str(p)!r}: needs inputs input_ids, position (or position_ids) and output logits "
                f"(inputs: {sorted(ev.input_specs)}, outputs: {sorted(outs)})"
            )
        fed = ("input_ids", self._position_input)
        self._io = [n for n in ev.input_specs if n not in fed and f"{n}_out" in outs]
        unpaired = [n for n in ev.input_specs if n not in (*fed, *self._io)]
        if unpaired:
            raise InvalidSettingError(f"coreml-eval {str(p)!r}: input {unpaired[0]!r} has no {unpaired[0]}_out output")
        self._io_shapes = {n: tuple(int(s) for s in ev.input_specs[n][0]) for n in self._io}
        unified = ev.state_shapes.get(UNIFIED_KV)
        if unified is not None and (len(unified) != 5 or unified[0] != 2):
            raise InvalidSettingError(
                f"coreml-eval {str(p)!r}: state {UNIFIED_KV!r} {list(unified)} is not [2, layers, kv_heads, "
                "max_context, head_dim] (keys, then values)"
            )
        if "key_cache" not in ev.state_shapes and unified is None:
            raise InvalidSettingError(f"coreml-eval {str(p)!r}: no 'key_cache' (or {UNIFIED_KV!r}) Core ML state")
        meta = {str(k): str(v) for k, v in ev.program_metadata.items()}
        self.max_context = int(ev.state_shapes["key_cache"][2] if unified is None else unified[3])
        self.vocab_size = _meta_int(meta, "vocab_size", p) or 0
        self.max_query = max(self._fixed) if self._fixed else (_meta_int(meta, "max_query", p) or 1)
        #: function -> fixed token count (None: a range); ``function_calls`` counts the calls of each
        self.functions: dict[str, int | None] = {
            f: q for q, f in sorted((q, e.function) for q, e in self._fixed.items())
        } or {"main": None}
        self.function_calls: Counter[str] = Counter()
        self.layout = "unified-kv" if unified is not None else "kv-mlstate" if self._io else "all-mlstate"
        self.tie_tolerance: float = FP16_TIE_TOLERANCE if tie_tolerance is None else float(tie_tolerance)
        # how closely it must follow its source (certify target --oracle): fp16 against float32
        self.source_rtol = float(source_rtol)
        self.source_router_margin = float(source_router_margin)
        self._id = next(CoreMLEvalTarget._ids)
        self._io_values: dict[str, np.ndarray] = {}
        self._processed = 0
        self.reset()
        if not self.vocab_size:
            self.vocab_size = int(self._call([0], 0)["logits"].shape[-1])
            self.reset()

    def __deepcopy__(self, memo: dict[int, Any]) -> CoreMLEvalTarget:
        """A fresh copy sharing the compiled (read-only) program; states copied."""
        new = copy.copy(self)
        new._ev = copy.copy(self._ev)
        new._ev.states = {n: v.copy() for n, v in self._ev.states.items()}
        new._fixed = {q: copy.copy(e) for q, e in self._fixed.items()}
        new.function_calls = Counter()
        new._io_values = {n: v.copy() for n, v in self._io_values.items()}
        new._id = next(CoreMLEvalTarget._ids)
        return new

    @property
    def processed(self) -> int:
        return self._processed

    def _call(self, chunk: list[int], position: int) -> dict[str, np.ndarray]:
        ev = self._fixed[len(chunk)] if self._fixed else self._ev
        ev.states = self._ev.states  # every function reads and writes the one set of Core ML states
        self.function_calls[ev.function] += 1
        if self.positions == "seed":  # every position so far and the chunk's (0 ..< processed + q): it reads the last q
            where = np.arange(position + len(chunk), dtype=np.int32)[None]
        else:
            where = np.array([position], np.int32)
        out = ev(input_ids=np.array([chunk], np.int32), **{self._position_input: where}, **self._io_values)
        for name in self._io:
            value = np.asarray(out[f"{name}_out"], np.float16)
            if value.shape != self._io_shapes[name]:
                raise TargetContractError(
                    f"coreml-eval: output {name}_out has shape {value.shape}, input {name} {self._io_shapes[name]}"
                )
            self._io_values[name] = value.copy()
        return out

    def _check(self, tokens: Sequence[int]) -> list[int]:
        if isinstance(tokens, str):
            raise TokenRangeError("CoreMLEvalTarget.forward: tokens must be a sequence of ints, got str")
        toks = list(tokens)
        for i, t in enumerate(toks):
            if type(t) is not int and not isinstance(t, np.integer):
                raise TokenRangeError(f"CoreMLEvalTarget.forward: tokens[{i}]={t!r} is not an integer token id")
            if not 0 <= t < self.vocab_size:
                raise TokenRangeError(
                    f"CoreMLEvalTarget.forward: tokens[{i}]={int(t)} is outside [0, {self.vocab_size})"
                )
        if self._processed + len(toks) > self.max_context:
            raise CapacityError(
                f"CoreMLEvalTarget.forward: processed={self._processed} + len(tokens)={len(toks)} exceeds "
                f"max_context={self.max_context}; nothing was changed"
            )
        return [int(t) for t in toks]

    def forward(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Feed ``tokens`` at ``position = processed`` in chunks of at most ``max_query``; logits ``[q, vocab]``."""
        toks = self._check(tokens)
        rows = [np.zeros((0, self.vocab_size), np.float32)]
        for start, stop in self._pieces(len(toks)):
            chunk = toks[start:stop]
            logits = np.asarray(self._call(chunk, self._processed)["logits"], np.float32)
            if logits.shape != (1, len(chunk), self.vocab_size):
                raise TargetContractError(
                    f"CoreMLEvalTarget.forward: logits shape {logits.shape}, expected (1, {len(chunk)}, "
                    f"{self.vocab_size})"
                )
            rows.append(logits[0])
            self._processed += len(chunk)
        return np.ascontiguousarray(np.concatenate(rows))

    def _pieces(self, n: int) -> list[tuple[int, int]]:
        """The calls a forward of ``n`` tokens makes: chunks of at most ``max_query`` (a range-shaped function), or
        with fixed-shape functions the largest that fits, then the next (``verify`` while K + 1 remain, then
        ``decode``): what a host feeding fixed shapes does."""
        out, start = [], 0
        while start < n:
            size = min(self.max_query, n - start)
            if self._fixed:
                size = max(q for q in self._fixed if q <= n - start)
            out.append((start, start + size))
            start += size
        return out

    def forward_with_checkpoints(self, tokens: Sequence[int]) -> tuple[npt.NDArray[np.float32], list[object]]:
        """``forward`` plus, per position, the state after it (the evaluator replaying one position at a time)."""
        toks = self._check(tokens)
        start = self.snapshot()
        checkpoints: list[object] = []
        for t in toks:
            self.forward([t])
            checkpoints.append(self.snapshot())
        self.restore(start)
        return self.forward(toks), checkpoints

    def snapshot(self) -> CoreMLEvalSnapshot:
        """Copy every state (Core ML states and input/output states) and ``processed``."""
        states = {n: v.copy() for n, v in self._ev.states.items()}
        states.update({n: v.copy() for n, v in self._io_values.items()})
        return CoreMLEvalSnapshot(processed=self._processed, states=states, target_id=self._id)

    def restore(self, snapshot: object) -> None:
        """Put back a snapshot of this target (its states and ``processed``)."""
        if not isinstance(snapshot, CoreMLEvalSnapshot) or snapshot.target_id != self._id:
            raise TargetContractError(
                f"CoreMLEvalTarget.restore: expected a CoreMLEvalSnapshot taken from this target, "
                f"got {type(snapshot).__name__}"
            )
        for name, value in snapshot.states.items():
            (self._io_values if name in self._io else self._ev.states)[name] = value.copy()
        self._processed = snapshot.processed

    def reset(self) -> None:
        """Zero states (as ``make_state()`` and zero input states) and ``processed = 0``."""
        self._ev.reset()
        self._io_values = {n: np.zeros(s, np.float16) for n, s in self._io_shapes.items()}
        self._processed = 0

    def state_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        """Every state as a float32 copy, KV caches cut to the valid prefix (axis 2); a unified ``kv_cache`` as
        ``key_cache`` and ``value_cache``."""
        out: dict[str, npt.NDArray[np.float32]] = {}
        for name, value in (*self._ev.states.items(), *self._io_values.items()):
            arr = np.array(value, dtype=np.float32)
            if name == UNIFIED_KV:  # keys, then values: named as the two-state layouts name them
                for half, kv_name in enumerate(KV_STATES):
                    out[kv_name] = arr[half, :, :, : self._processed].copy()
                continue
            out[name] = arr[:, :, : self._processed].copy() if name in KV_STATES else arr
        return out

    def describe(self) -> str:
        states = ",".join([*self._ev.state_names, *self._io])
        functions = ",".join(f"{f}:{q}" for f, q in self.functions.items()) if self._fixed else ""
        return (
            f"CoreMLEvalTarget {self.path} ({self.layout}, positions {self.positions}) vocab={self.vocab_size} "
            f"max_context={self.max_context} "
            f"max_query={self.max_query} states={states}" + (f" functions={functions}" if functions else "")
        )

    def __repr__(self) -> str:
        return f"<{self.describe()} processed={self._processed}>"


def _signature(ev: MilEvaluator) -> tuple[object, ...]:
    """What every function of a bundle must share: inputs but input_ids, states, outputs (names, shapes, dtypes)."""
    inputs = {n: v for n, v in ev.input_specs.items() if n not in ("input_ids", "position_ids")}
    inputs.update({n: (len(v[0]), v[1]) for n, v in ev.input_specs.items() if n == "position_ids"})  # grows with q
    return (sorted(inputs.items(), key=str), sorted(ev.state_shapes.items()), sorted(ev.output_names))


def _functions(path: Path) -> tuple[MilEvaluator, dict[int, MilEvaluator]]:
    """(the primary function, fixed token count -> function). A single-function bundle: its ``main``, no fixed
    ones. A multifunction bundle: every function has a fixed ``input_ids`` ``[1, q]`` (one with q = 1, so any
    length can be fed), distinct q, and the primary's inputs, states and outputs; the primary is the q = 1 one."""
    program = load_program(path)
    # a tree function (coreml_eval_tree) threads no state; the chain functions are judged here
    names = [name for name, fn in program.functions.items() if PARENTS not in fn.inputs]
    if names == ["main"]:
        return MilEvaluator(path, program=program), {}
    fixed: dict[int, MilEvaluator] = {}
    for name in names:
        ev = MilEvaluator(path, function=name, program=program)
        shape = ev.input_specs.get("input_ids", ((),))[0]
        q = shape[-1] if len(shape) == 2 and isinstance(shape[-1], (int, np.integer)) else None
        if q is None:
            raise InvalidSettingError(
                f"coreml-eval {str(path)!r}: function {name!r} has input_ids {list(shape)}; a multifunction bundle "
                "needs a fixed [1, q] in every function"
            )
        if int(q) in fixed:
            raise InvalidSettingError(
                f"coreml-eval {str(path)!r}: functions {fixed[int(q)].function!r} and {name!r} both take {q} tokens"
            )
        fixed[int(q)] = ev
    if 1 not in fixed:
        raise InvalidSettingError(
            f"coreml-eval {str(path)!r}: no function takes one token (input_ids [1, 1]): a decode step cannot be fed"
        )
    primary = fixed[1]
    for ev in fixed.values():
        if _signature(ev) != _signature(primary):
            raise InvalidSettingError(
                f"coreml-eval {str(path)!r}: function {ev.function!r} does not share {primary.function!r}'s inputs, "
                "states and outputs; the functions of one bundle must thread the same states"
            )
    return primary, fixed


def load_spec(args: str, *, open_target: Any = None) -> CoreMLEvalTarget:
    """The ``coreml-eval:PATH[,tie_tolerance=X][,source_rtol=X][,source_router_margin=X]`` target spec; ``open_target``
    builds the target from the path and options (the registry's ``coreml_eval_tree.load_spec`` passes its own)."""
    path, _, options = args.partition(",")
    if not path:
        raise InvalidSettingError("coreml-eval:PATH needs the path of a .mlpackage")
    kwargs: dict[str, float] = {}
    for item in filter(None, options.split(",")):
        key, eq, value = item.partition("=")
        if key not in _OPTIONS or not eq:
            raise InvalidSettingError(
                f"coreml-eval target option {item!r}: one of {', '.join(k + '=X' for k in _OPTIONS)}"
            )
        try:
            kwargs[key] = float(value)
        except ValueError:
            raise InvalidSettingError(f"coreml-eval target option {item!r}: X must be a number") from None
        if not kwargs[key] >= 0:
            raise InvalidSettingError(f"coreml-eval target option {item!r}: X must be >= 0")
    try:
        return (open_target or CoreMLEvalTarget)(path, **kwargs)
    except UnknownOpError as exc:  # the spec can still be named: a usage error, not a failed certification
        raise InvalidSettingError(str(exc)) from exc
