"""A small numpy evaluator for saved Core ML ML programs: exactly the ops specproof's export uses.

It loads the ``.mlpackage`` as written (spec plus weight blob, through coremltools'
MIL proto loader, so the weights are the stored fp16 ones) and runs its ops in order.
Each op is computed in float32 and rounded to the op's declared output dtype, which
is what an fp16 kernel with fp32 accumulation gives. Any op type, or op option, it
does not implement raises ``UnknownOpError``: a new op in the export must be added
here on purpose, never skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np


class UnknownOpError(NotImplementedError):
    """The program uses an op (or an option of one) the evaluator does not implement."""


def load_program(path: str | Path) -> Any:
    """The MIL program of a saved ``.mlpackage`` (spec + weights), as coremltools' proto loader reads it."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto import load as milproto

    spec = ct.utils.load_spec(str(path))
    weights = Path(path) / "Data" / "com.apple.CoreML" / "weights"
    return milproto.load(spec, spec.specificationVersion, file_weights_dir=str(weights))


def _np_dtype(var: Any) -> Any:
    from coremltools.converters.mil.mil import types

    return types.nptype_from_builtin(var.dtype)


_CASTS = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32, "int16": np.int16, "bool": np.bool_}


def _slices(shape: tuple[int, ...], op: Mapping[str, Any]) -> tuple[Any, ...]:
    rank = len(shape)
    begin, end = op["begin"], op["end"]
    stride = op.get("stride")
    bm, em, sm = (op.get(k) for k in ("begin_mask", "end_mask", "squeeze_mask"))
    out: list[Any] = []
    for i in range(rank):
        st = 1 if stride is None else int(stride[i])
        if sm is not None and sm[i]:
            out.append(int(begin[i]))
            continue
        b = None if bm is not None and bm[i] else int(begin[i])
        e = None if em is not None and em[i] else int(end[i])
        out.append(slice(b, e, st))
    return tuple(out)


def _conv(a: Mapping[str, Any]) -> np.ndarray:
    x, w = a["x"], a["weight"]
    if x.ndim != 3:
        raise UnknownOpError(f"conv: only 1-D convolutions are implemented, got x of rank {x.ndim}")
    for key, ok in (("strides", [1]), ("dilations", [1])):
        if key in a and list(a[key]) != ok:
            raise UnknownOpError(f"conv: {key}={list(a[key])} is not implemented")
    pad_type = str(a.get("pad_type", "valid"))
    if pad_type not in ("valid", "custom") or ("pad" in a and any(a["pad"])):
        raise UnknownOpError(f"conv: pad_type={pad_type!r} pad={a.get('pad')} is not implemented (valid only)")
    groups = int(a.get("groups", 1))
    n, _, t = x.shape
    c_out, per_group, k = w.shape
    out_len = t - k + 1
    out = np.zeros((n, c_out, out_len), np.float32)
    outs_per_group = c_out // groups
    for o in range(c_out):
        g = o // outs_per_group
        for ci in range(per_group):
            channel = g * per_group + ci
            for tap in range(k):
                out[:, o] += w[o, ci, tap] * x[:, channel, tap : tap + out_len]
    if a.get("bias") is not None:
        out += a["bias"][None, :, None]
    return out


def _matmul(a: Mapping[str, Any]) -> np.ndarray:
    x, y = a["x"], a["y"]
    if a.get("transpose_x"):
        x = np.swapaxes(x, -1, -2)
    if a.get("transpose_y"):
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


def _linear(a: Mapping[str, Any]) -> np.ndarray:
    out = np.matmul(a["x"], a["weight"].T)
    if a.get("bias") is not None:
        out = out + a["bias"]
    return out


def _softmax(a: Mapping[str, Any]) -> np.ndarray:
    x = a["x"]
    e = np.exp(x - x.max(axis=int(a["axis"]), keepdims=True))
    return e / e.sum(axis=int(a["axis"]), keepdims=True)


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
    idx = a["indices"].astype(np.int64)
    size = a["x"].shape[int(a["axis"])]
    if (idx < 0).any() or (idx >= size).any():
        raise IndexError(f"gather: index outside [0, {size})")
    return np.take(a["x"], idx, axis=int(a["axis"]))


def _squeeze(a: Mapping[str, Any]) -> np.ndarray:
    axes = a.get("axes")
    return np.squeeze(a["x"]) if axes is None else np.squeeze(a["x"], axis=tuple(int(i) for i in axes))


def _slice_update(a: Mapping[str, Any]) -> np.ndarray:
    x = a["x"].copy()
    sl = _slices(x.shape, a)
    target_shape = x[sl].shape
    if a["update"].shape != target_shape:
        raise ValueError(f"slice_update: update shape {a['update'].shape} != slice shape {target_shape}")
    x[sl] = a["update"]
    return x


def _reduce_mean(a: Mapping[str, Any]) -> np.ndarray:
    axes = tuple(int(i) for i in a["axes"])
    return np.mean(a["x"], axis=axes, keepdims=bool(a.get("keep_dims", False)))


_OPS: dict[str, Callable[[Mapping[str, Any]], np.ndarray]] = {
    "add": lambda a: a["x"] + a["y"],
    "mul": lambda a: a["x"] * a["y"],
    "less_equal": lambda a: a["x"] <= a["y"],
    "greater_equal": lambda a: a["x"] >= a["y"],
    "select": lambda a: np.where(a["cond"], a["a"], a["b"]),
    "rsqrt": lambda a: 1.0 / np.sqrt(a["x"] + a.get("epsilon", 1e-12)),
    "silu": lambda a: a["x"] / (1.0 + np.exp(-a["x"])),
    "cast": lambda a: a["x"].astype(_CASTS[str(a["dtype"])]),
    "linear": _linear,
    "matmul": _matmul,
    "conv": _conv,
    "softmax": _softmax,
    "reduce_mean": _reduce_mean,
    "reshape": _reshape,
    "transpose": lambda a: np.transpose(a["x"], [int(i) for i in a["perm"]]),
    "expand_dims": lambda a: np.expand_dims(a["x"], tuple(int(i) for i in a["axes"])),
    "squeeze": _squeeze,
    "concat": _concat,
    "gather": _gather,
    "slice_by_index": lambda a: a["x"][_slices(a["x"].shape, a)],
    "slice_update": _slice_update,
    "shape": lambda a: np.array(a["x"].shape, np.int32),
    "range_1d": lambda a: np.arange(int(a["start"]), int(a["end"]), int(a["step"])),
}


class MilEvaluator:
    """Runs the ``main`` function of a saved ML program in numpy, holding its states between calls."""

    def __init__(self, path: str | Path, *, function: str = "main") -> None:
        self.program = load_program(path)
        self.function = self.program.functions[function]
        self.state_names = [n for n, v in self.function.inputs.items() if _is_state(v)]
        self.states: dict[str, np.ndarray] = {}
        self.op_types_seen: set[str] = set()
        self.reset()

    def reset(self) -> None:
        """Zero every state, as ``MLModel.make_state()`` does."""
        self.states = {}
        for name in self.state_names:
            var = self.function.inputs[name]
            self.states[name] = np.zeros(var.shape, np.float16)

    def __call__(self, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        env: dict[str, Any] = {}
        for name, var in self.function.inputs.items():
            if _is_state(var):
                env[name] = name  # a state var resolves to its name; read_state looks it up
            elif name not in inputs:
                raise KeyError(f"missing input {name!r}")
            else:
                env[name] = np.asarray(inputs[name]).astype(_np_dtype(var))
        for op in self.function.operations:
            self.op_types_seen.add(op.op_type)
            if op.op_type == "const":
                env[op.outputs[0].name] = np.asarray(op.outputs[0].val)
                continue
            args: dict[str, Any] = {}
            for key, value in op.inputs.items():
                if isinstance(value, (tuple, list)):
                    args[key] = [self._lookup(env, v) for v in value]
                else:
                    args[key] = self._lookup(env, value)
            if op.op_type == "read_state":
                result = self.states[args["input"]].copy()
            elif op.op_type == "coreml_update_state":
                value = np.asarray(args["value"], np.float16)
                self.states[args["state"]] = value.copy()
                result = value
            else:
                fn = _OPS.get(op.op_type)
                if fn is None:
                    raise UnknownOpError(f"op {op.name!r}: op type {op.op_type!r} is not implemented by the evaluator")
                upcast = {k: (v.astype(np.float32) if _is_f16(v) else v) for k, v in args.items()}
                upcast = {
                    k: ([x.astype(np.float32) if _is_f16(x) else x for x in v] if isinstance(v, list) else v)
                    for k, v in upcast.items()
                }
                result = fn(upcast)
            out = op.outputs[0]
            env[out.name] = np.asarray(result).astype(_np_dtype(out))
        return {v.name: env[v.name] for v in self.function.outputs}

    @staticmethod
    def _lookup(env: Mapping[str, Any], var: Any) -> Any:
        if var.name in env:
            return env[var.name]
        if var.val is not None:
            return np.asarray(var.val)
        raise KeyError(f"var {var.name!r} used before it is defined")


def _is_f16(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.dtype == np.float16


def _is_state(var: Any) -> bool:
    from coremltools.converters.mil.mil import types

    return bool(types.is_state(var.sym_type))
