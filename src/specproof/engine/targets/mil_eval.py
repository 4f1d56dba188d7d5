"""A numpy evaluator of saved Core ML ML programs, limited to the ops specproof's exporter writes.

``MilEvaluator(path)`` loads an ``.mlpackage`` as written (spec plus weight blob, through
coremltools' MIL proto loader, so the weights are the stored fp16 ones), compiles its
``main`` function into a list of steps once, and runs them in order per call. Each op is
computed in float32 and rounded to the op's declared output dtype: what an fp16 kernel
with fp32 accumulation gives. Products are taken one row at a time (``[1, k] @ [k, n]``),
reductions along contiguous rows, so a row does not depend on how many rows a call has.

``OPS`` lists the op types it implements (plus ``const``, ``read_state``,
``coreml_update_state`` and ``while_loop``). Any other op type, or an option of a listed
op it does not implement, raises ``UnknownOpError`` naming the op and the program: a new
op in an export must be added here on purpose, never skipped.

Needs coremltools (to read the bundle), but not Core ML: it runs on any OS.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from specproof.contract.errors import InvalidSettingError, SpecproofError

__all__ = ["OPS", "MilEvaluator", "UnknownOpError", "load_program"]

_F32 = np.float32
_Fn = Callable[[Mapping[str, Any]], Any]


class UnknownOpError(SpecproofError, NotImplementedError):
    """The program uses an op (or an option of one) the evaluator does not implement."""


def load_program(path: str | Path) -> Any:
    """The MIL program of a saved ``.mlpackage`` (spec + weights), as coremltools' proto loader reads it."""
    from specproof.engine.targets.coreml import import_coremltools

    ct = import_coremltools("the ML-program evaluator")
    from coremltools.converters.mil.frontend.milproto import load as milproto

    p = Path(path)
    if not (p / "Manifest.json").is_file():
        raise InvalidSettingError(f"{str(p)!r} is not an .mlpackage (no Manifest.json)")
    try:
        spec = ct.utils.load_spec(str(p))
    except Exception as exc:  # a corrupt spec: a clear error, never coremltools' traceback
        raise InvalidSettingError(f"{str(p)!r}: not a readable Core ML spec ({type(exc).__name__}: {exc})") from None
    if spec.WhichOneof("Type") != "mlProgram":
        raise InvalidSettingError(f"{str(p)!r} is not an ML program ({spec.WhichOneof('Type')})")
    weights = p / "Data" / "com.apple.CoreML" / "weights"
    try:
        program = milproto.load(spec, spec.specificationVersion, file_weights_dir=str(weights))
    except Exception as exc:  # e.g. "Mismatch between var types": a state or output typed unlike its values
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidSettingError(
            f"{str(p)!r}: coremltools cannot load its ML program ({type(exc).__name__}: {first}); "
            "`specproof bundle inspect` names the disagreement"
        ) from None
    program.specproof_metadata = {str(k): str(v) for k, v in spec.description.metadata.userDefined.items()}
    return program


def _np_dtype(var: Any) -> Any:
    from coremltools.converters.mil.mil import types

    return types.nptype_from_builtin(var.dtype)


_CASTS: Final = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32, "int16": np.int16, "bool": np.bool_}


def _slices(shape: tuple[int, ...], a: Mapping[str, Any]) -> tuple[Any, ...]:
    begin, end, stride = a["begin"], a["end"], a.get("stride")
    bm, em, sm = (a.get(k) for k in ("begin_mask", "end_mask", "squeeze_mask"))
    out: list[Any] = []
    for i in range(len(shape)):
        st = 1 if stride is None else int(stride[i])
        if sm is not None and sm[i]:
            out.append(int(begin[i]))
            continue
        b = None if bm is not None and bm[i] else int(begin[i])
        e = None if em is not None and em[i] else int(end[i])
        out.append(slice(b, e, st))
    return tuple(out)


def _int(v: Any) -> int:
    """A scalar (or one-element) integer argument."""
    arr = np.asarray(v).reshape(-1)
    if arr.size != 1:
        raise ValueError(f"expected one integer, got shape {np.shape(v)}")
    return int(arr[0])


def _conv(a: Mapping[str, Any]) -> np.ndarray:
    x, w = a["x"], a["weight"]
    if x.ndim != 3:
        raise UnknownOpError(f"conv: only 1-D convolutions are implemented, got x of rank {x.ndim}")
    for key in ("strides", "dilations"):
        if key in a and list(a[key]) != [1]:
            raise UnknownOpError(f"conv: {key}={list(a[key])} is not implemented")
    pad_type = str(a.get("pad_type", "valid"))
    if pad_type not in ("valid", "custom") or ("pad" in a and any(a["pad"])):
        raise UnknownOpError(f"conv: pad_type={pad_type!r} pad={a.get('pad')} is not implemented (valid only)")
    groups = int(a.get("groups", 1))
    c_out, per_group, k = w.shape
    out_len = x.shape[2] - k + 1
    if per_group == 1 and groups == c_out == x.shape[1]:  # depthwise: taps summed in a fixed order
        out = w[None, :, 0, 0:1] * x[:, :, 0:out_len]
        for tap in range(1, k):
            out = out + w[None, :, 0, tap : tap + 1] * x[:, :, tap : tap + out_len]
    else:
        out = np.zeros((x.shape[0], c_out, out_len), _F32)
        outs_per_group = c_out // groups
        for o in range(c_out):
            g = o // outs_per_group
            for ci in range(per_group):
                for tap in range(k):
                    out[:, o] += w[o, ci, tap] * x[:, g * per_group + ci, tap : tap + out_len]
    if a.get("bias") is not None:
        out = out + a["bias"][None, :, None]
    return out


def _matmul(a: Mapping[str, Any]) -> np.ndarray:
    x, y = a["x"], a["y"]
    if a.get("transpose_x"):
        x = np.swapaxes(x, -1, -2)
    if a.get("transpose_y"):
        y = np.swapaxes(y, -1, -2)
    # one [1, k] @ [k, n] product per row of x: a row's result does not depend on the other rows
    return np.matmul(np.ascontiguousarray(x)[..., :, None, :], np.ascontiguousarray(y)[..., None, :, :])[..., 0, :]


def _linear(a: Mapping[str, Any]) -> np.ndarray:
    x = a["x"]
    w_t = a["weight_t"] if "weight_t" in a else np.ascontiguousarray(a["weight"].T)
    out = np.matmul(np.ascontiguousarray(x)[..., None, :], w_t)[..., 0, :]
    if a.get("bias") is not None:
        out = out + a["bias"]
    return out


def _softmax(a: Mapping[str, Any]) -> np.ndarray:
    axis = int(a["axis"])
    x = a["x"]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _reshape(a: Mapping[str, Any]) -> np.ndarray:
    shape = [int(s) for s in a["shape"]]
    if 0 in shape:
        raise UnknownOpError("reshape: a 0 in the target shape is not implemented")
    return a["x"].reshape(shape)


def _concat(a: Mapping[str, Any]) -> np.ndarray:
    if a.get("interleave"):
        raise UnknownOpError("concat: interleave=True is not implemented")
    return np.concatenate(a["values"], axis=int(a["axis"]))


def _gather(a: Mapping[str, Any]) -> np.ndarray:
    if int(a.get("batch_dims", 0)):
        raise UnknownOpError("gather: batch_dims != 0 is not implemented")
    idx = np.asarray(a["indices"]).astype(np.int64)
    size = a["x"].shape[int(a["axis"])]
    if (idx < -size).any() or (idx >= size).any():
        raise IndexError(f"gather: index outside [-{size}, {size})")
    return np.take(a["x"], idx % size, axis=int(a["axis"]))


def _squeeze(a: Mapping[str, Any]) -> np.ndarray:
    axes = a.get("axes")
    return np.squeeze(a["x"]) if axes is None else np.squeeze(a["x"], axis=tuple(int(i) for i in axes))


def _slice_by_size(a: Mapping[str, Any]) -> np.ndarray:
    """``x[begin : begin + size]`` per axis; a size of -1 runs to the end (what the torch frontend writes)."""
    x = a["x"]
    begin = [int(b) for b in np.asarray(a["begin"]).reshape(-1)]
    size = [int(s) for s in np.asarray(a["size"]).reshape(-1)]
    if len(begin) != x.ndim or len(size) != x.ndim:
        raise ValueError(f"slice_by_size: begin {begin} / size {size} do not match rank {x.ndim}")
    index = []
    for axis, (b, n) in enumerate(zip(begin, size, strict=True)):
        b = b % x.shape[axis] if b < 0 else b
        index.append(slice(b, None if n == -1 else b + n))
    return x[tuple(index)]


def _split(a: Mapping[str, Any]) -> list[np.ndarray]:
    x, axis = a["x"], int(a["axis"])
    if a.get("split_sizes") is not None:
        bounds = np.cumsum([int(s) for s in np.asarray(a["split_sizes"]).reshape(-1)])[:-1]
        return list(np.split(x, bounds, axis=axis))
    return list(np.split(x, int(a["num_splits"]), axis=axis))


def _slice_update(a: Mapping[str, Any]) -> np.ndarray:
    x = a["x"].copy()
    sl = _slices(x.shape, a)
    target_shape = x[sl].shape
    update = a["update"]
    if update.shape != target_shape:
        raise ValueError(f"slice_update: update shape {update.shape} != slice shape {target_shape}")
    x[sl] = update
    return x


def _reduce(fn: Callable[..., np.ndarray]) -> _Fn:
    def run(a: Mapping[str, Any]) -> np.ndarray:
        axes = a.get("axes")
        ax = None if axes is None else tuple(int(i) for i in axes)
        return fn(np.ascontiguousarray(a["x"]), axis=ax, keepdims=bool(a.get("keep_dims", False)))

    return run


def _rsqrt(a: Mapping[str, Any]) -> np.ndarray:
    eps = a.get("epsilon")
    return 1.0 / np.sqrt(a["x"] + (_F32(1e-12) if eps is None else eps))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(_F32(0.0), x)


OPS: Final[dict[str, _Fn]] = {
    "add": lambda a: a["x"] + a["y"],
    "sub": lambda a: a["x"] - a["y"],
    "mul": lambda a: a["x"] * a["y"],
    "real_div": lambda a: a["x"] / a["y"],
    "maximum": lambda a: np.maximum(a["x"], a["y"]),
    "minimum": lambda a: np.minimum(a["x"], a["y"]),
    "less": lambda a: a["x"] < a["y"],
    "less_equal": lambda a: a["x"] <= a["y"],
    "greater": lambda a: a["x"] > a["y"],
    "greater_equal": lambda a: a["x"] >= a["y"],
    "equal": lambda a: a["x"] == a["y"],
    "logical_and": lambda a: np.logical_and(a["x"], a["y"]),
    "logical_or": lambda a: np.logical_or(a["x"], a["y"]),
    "logical_not": lambda a: np.logical_not(a["x"]),
    "select": lambda a: np.where(a["cond"], a["a"], a["b"]),
    "rsqrt": _rsqrt,
    "exp": lambda a: np.exp(a["x"]),
    "silu": lambda a: a["x"] * _sigmoid(a["x"]),
    "sigmoid": lambda a: _sigmoid(a["x"]),
    "softplus": lambda a: _softplus(a["x"]),
    "cast": lambda a: a["x"].astype(_CASTS[str(a["dtype"])]),
    "identity": lambda a: a["x"],
    "linear": _linear,
    "matmul": _matmul,
    "conv": _conv,
    "softmax": _softmax,
    "reduce_mean": _reduce(np.mean),
    "reduce_sum": _reduce(np.sum),
    "reshape": _reshape,
    "transpose": lambda a: np.transpose(a["x"], [int(i) for i in a["perm"]]),
    "expand_dims": lambda a: np.expand_dims(a["x"], tuple(int(i) for i in a["axes"])),
    "squeeze": _squeeze,
    "concat": _concat,
    "gather": _gather,
    "slice_by_index": lambda a: a["x"][_slices(a["x"].shape, a)],
    "slice_update": _slice_update,
    "slice_by_size": _slice_by_size,
    "split": _split,
    "tile": lambda a: np.tile(a["x"], [int(r) for r in a["reps"]]),
    "sqrt": lambda a: np.sqrt(a["x"]),
    "tanh": lambda a: np.tanh(a["x"]),
    "abs": lambda a: np.abs(a["x"]),
    "pow": lambda a: np.power(a["x"], a["y"]),
    "shape": lambda a: np.array(a["x"].shape, np.int32),
    "range_1d": lambda a: np.arange(_int(a["start"]), _int(a["end"]), _int(a["step"]), dtype=np.int32),
}
_SPECIAL: Final = ("const", "read_state", "coreml_update_state", "while_loop")


def _store(value: Any, dtype: Any) -> np.ndarray:
    """A value as held between ops: fp16 rounded and kept as float32 (computed on as fp32), else the dtype."""
    if dtype == np.float16:
        return np.asarray(value).astype(np.float16).astype(_F32, order="C")
    return np.asarray(value).astype(dtype, order="C")


class _Step:
    """One op, compiled: its type, argument sources (a var name or a constant), outputs, nested blocks."""

    __slots__ = ("args", "blocks", "name", "op_type", "out_dtypes", "outs")

    def __init__(self, op: Any, program: str) -> None:
        self.op_type: str = op.op_type
        self.name: str = op.name
        if self.op_type not in OPS and self.op_type not in _SPECIAL:
            raise UnknownOpError(
                f"{program}: op {op.name!r}: op type {op.op_type!r} is not implemented by the evaluator "
                f"(it implements {', '.join(sorted(OPS))} and {', '.join(_SPECIAL)})"
            )
        if op.blocks and self.op_type != "while_loop":
            raise UnknownOpError(f"{program}: op {op.name!r}: nested blocks of {op.op_type!r} are not implemented")
        self.outs = [o.name for o in op.outputs]
        self.out_dtypes = [_np_dtype(o) for o in op.outputs]
        self.args: dict[str, Any] = {}
        for key, value in op.inputs.items():
            if isinstance(value, (tuple, list)):
                self.args[key] = [_source(v) for v in value]
            else:
                self.args[key] = _source(value)
        if self.op_type == "linear" and isinstance(self.args.get("weight"), _Const):
            self.args["weight_t"] = _Const(np.ascontiguousarray(self.args.pop("weight").value.T))
        if self.op_type == "const":
            self.args = {"value": _Const(_store(op.outputs[0].val, self.out_dtypes[0]))}
        self.blocks = [_Block(b, program) for b in op.blocks]


class _Const:
    __slots__ = ("value",)

    def __init__(self, value: np.ndarray) -> None:
        self.value = value


def _source(var: Any) -> Any:
    """A var produced at run time (its name), or a value known at load time (a constant)."""
    if var.op is not None and var.op.op_type == "const":
        return var.name
    if var.op is None and var.val is not None and not _is_state(var):
        return _Const(_store(var.val, _np_dtype(var)))
    return var.name


class _Block:
    __slots__ = ("inputs", "outputs", "steps")

    def __init__(self, block: Any, program: str) -> None:
        ins = block.inputs.values() if isinstance(block.inputs, Mapping) else block.inputs
        self.inputs = [v.name for v in ins]
        self.outputs = [v.name for v in block.outputs]
        self.steps = [_Step(op, program) for op in block.operations]


def _is_state(var: Any) -> bool:
    from coremltools.converters.mil.mil import types

    return bool(types.is_state(var.sym_type))


class MilEvaluator:
    """Runs the ``main`` function of a saved ML program in numpy, holding its Core ML states between calls.

    ``states`` maps each state name to its fp16 value (zeros after ``reset()``, as
    ``MLModel.make_state()`` gives). ``__call__(**inputs)`` returns every output in its
    declared dtype. ``op_types`` is the set of op types the program uses.
    """

    MAX_LOOP_ITERATIONS: Final = 1 << 16

    def __init__(self, path: str | Path, *, function: str = "main", program: Any = None) -> None:
        """``program``: the one ``load_program(path)`` gave (another function of it is then not read again)."""
        self.path = Path(path)
        self.function = function
        self.program = load_program(path) if program is None else program
        self.program_metadata: dict[str, str] = dict(self.program.specproof_metadata)
        if function not in self.program.functions:
            raise InvalidSettingError(f"{str(path)!r} has no function {function!r}")
        fn = self.program.functions[function]
        label = f"ML program {str(self.path)!r} function {function!r}"
        self.state_names = [n for n, v in fn.inputs.items() if _is_state(v)]
        self.input_specs = {n: (tuple(v.shape), _np_dtype(v)) for n, v in fn.inputs.items() if not _is_state(v)}
        self.state_shapes = {n: tuple(int(s) for s in fn.inputs[n].shape) for n in self.state_names}
        self.output_names = [v.name for v in fn.outputs]
        self._output_dtypes = {v.name: _np_dtype(v) for v in fn.outputs}
        self._main = _Block(fn, label)
        self._label = label
        self.op_types = frozenset(_op_types(self._main))
        self.states: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        """Zero every state, as ``MLModel.make_state()`` does."""
        self.states = {name: np.zeros(shape, np.float16) for name, shape in self.state_shapes.items()}

    def __call__(self, **inputs: Any) -> dict[str, np.ndarray]:
        env: dict[str, Any] = {}
        for name, (_, dtype) in self.input_specs.items():
            if name not in inputs:
                raise InvalidSettingError(f"{self._label}: missing input {name!r}")
            env[name] = _store(inputs[name], dtype)
        for name in self.state_names:
            env[name] = name  # a state var resolves to its name; read_state looks it up
        self._run(self._main.steps, env)
        return {n: np.asarray(env[n]).astype(self._output_dtypes[n]) for n in self.output_names}

    def _run(self, steps: list[_Step], env: dict[str, Any]) -> None:
        for step in steps:
            if step.op_type == "const":
                env[step.outs[0]] = step.args["value"].value
                continue
            args = {k: _resolve(env, v) for k, v in step.args.items()}
            if step.op_type == "read_state":
                env[step.outs[0]] = self.states[args["input"]].astype(_F32)
            elif step.op_type == "coreml_update_state":
                value = np.asarray(args["value"], np.float16)
                self.states[args["state"]] = value.copy()
                env[step.outs[0]] = value.astype(_F32)
            elif step.op_type == "while_loop":
                for name, value in zip(step.outs, self._loop(step, args["loop_vars"], env), strict=True):
                    env[name] = value
            elif len(step.outs) > 1:  # split: one value per output
                values = OPS[step.op_type](args)
                for name, value, dtype in zip(step.outs, values, step.out_dtypes, strict=True):
                    env[name] = _store(value, dtype)
            else:
                env[step.outs[0]] = _store(OPS[step.op_type](args), step.out_dtypes[0])

    def _loop(self, step: _Step, values: list[Any], env: dict[str, Any]) -> list[Any]:
        if len(step.blocks) != 2:
            raise UnknownOpError(f"{self._label}: op {step.name!r}: a while_loop without cond and body blocks")
        cond, body = step.blocks
        for _ in range(self.MAX_LOOP_ITERATIONS):
            scope = dict(env)
            scope.update(zip(cond.inputs, values, strict=True))
            self._run(cond.steps, scope)
            if not bool(np.asarray(scope[cond.outputs[0]])):
                return values
            scope = dict(env)
            scope.update(zip(body.inputs, values, strict=True))
            self._run(body.steps, scope)
            values = [scope[n] for n in body.outputs]
        raise UnknownOpError(f"{self._label}: op {step.name!r}: while_loop ran {self.MAX_LOOP_ITERATIONS} iterations")


def _resolve(env: Mapping[str, Any], source: Any) -> Any:
    if isinstance(source, list):
        return [_resolve(env, s) for s in source]
    if isinstance(source, _Const):
        return source.value
    try:
        return env[source]
    except KeyError:
        raise KeyError(f"var {source!r} used before it is defined") from None


def _op_types(block: _Block) -> set[str]:
    out = set()
    for step in block.steps:
        out.add(step.op_type)
        for sub in step.blocks:
            out |= _op_types(sub)
    return out
