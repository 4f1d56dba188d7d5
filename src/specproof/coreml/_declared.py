"""Does a function's declared interface (the model description Core ML reads) agree with its program?

The description (``spec.description``: inputs, outputs, states with dtypes and shapes) is what
Core ML and every host loop read; the ML program's function (its inputs' and states' value types,
the types of the vars it returns) is what runs. A bundle edited by hand or written by a
converter that patched one and not the other disagrees with itself: Core ML refuses it at load
time, or coremltools' own loader fails with "Mismatch between var types". ``declared_problems``
names each disagreement, read from the spec alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

__all__ = ["declared_problems"]

# the model description's array dtypes -> the ML program's
_DTYPES: Final = {"INT32": "INT32", "FLOAT16": "FLOAT16", "FLOAT32": "FLOAT32", "DOUBLE": "FLOAT64"}


def _program_type(vt: Any) -> tuple[str, tuple[object, ...]] | None:
    """(dtype, dims) of a MIL value type (a state's wrapped tensor too); ``"?"`` for a symbolic dim."""
    from coremltools.proto import MIL_pb2

    if vt.WhichOneof("type") == "stateType":
        vt = vt.stateType.wrappedType
    if vt.WhichOneof("type") != "tensorType":
        return None
    tt = vt.tensorType
    dims = tuple(d.constant.size if d.WhichOneof("dimension") == "constant" else "?" for d in tt.dimensions)
    return MIL_pb2.DataType.Name(tt.dataType), dims


def _declared_type(array: Any) -> tuple[str, list[tuple[int, int]] | None]:
    """(dtype, per-dimension (low, high) or None when the shape is not declared or enumerated)."""
    from coremltools.proto import FeatureTypes_pb2 as ft

    dtype = ft.ArrayFeatureType.ArrayDataType.Name(array.dataType)
    flex = array.WhichOneof("ShapeFlexibility")
    if flex == "enumeratedShapes":
        return dtype, None
    if flex == "shapeRange":
        return dtype, [(int(r.lowerBound), int(r.upperBound)) for r in array.shapeRange.sizeRanges]
    shape = [int(s) for s in array.shape]
    return dtype, [(s, s) for s in shape] if shape else None


def _disagreements(
    kind: str, name: str, declared: Any, program: tuple[str, tuple[object, ...]] | None
) -> Iterator[str]:
    if program is None:
        return
    dtype, dims = _declared_type(declared)
    p_dtype, p_dims = program
    if _DTYPES.get(dtype, dtype) != p_dtype:
        yield f"{kind} {name!r} is declared {dtype}, the program's is {p_dtype}"
        return
    if dims is None:
        return
    if len(dims) != len(p_dims):
        yield f"{kind} {name!r} is declared with rank {len(dims)} {_text(dims)}, the program's is {list(p_dims)}"
        return
    for (lo, hi), got in zip(dims, p_dims, strict=True):
        fits = isinstance(got, int) and (lo, hi) == (got, got)
        if got != "?" and not fits:
            yield f"{kind} {name!r} is declared {_text(dims)}, the program's is {list(p_dims)}"
            return


def _text(dims: list[tuple[int, int]]) -> str:
    return "[" + ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in dims) + "]"


def declared_problems(fdesc: Any, func: Any, block: Any) -> list[str]:
    """Every input, state and output whose declared dtype or shape disagrees with the program's (or that one
    side has and the other lacks)."""
    program_inputs = {nv.name: nv.type for nv in func.inputs}
    problems: list[str] = []
    for kind, features in (("input", fdesc.input), ("state", fdesc.state)):
        for feature in features:
            vt = program_inputs.get(feature.name)
            if vt is None:
                problems.append(f"{kind} {feature.name!r} is declared but the program has no such input")
                continue
            is_state = vt.WhichOneof("type") == "stateType"
            if is_state != (kind == "state"):
                problems.append(
                    f"{feature.name!r} is declared as {'a state' if kind == 'state' else 'an input'}, the program's "
                    f"is {'a state' if is_state else 'a tensor input'}"
                )
                continue
            array = feature.type.stateType.arrayType if kind == "state" else feature.type.multiArrayType
            if kind == "input" and feature.type.WhichOneof("Type") != "multiArrayType":
                continue
            problems.extend(_disagreements(kind, feature.name, array, _program_type(vt)))
    declared = {f.name for f in (*fdesc.input, *fdesc.state)}
    for name in program_inputs:
        if name not in declared:
            problems.append(f"the program's input {name!r} is not declared")
    producers = {out.name: out.type for op in block.operations for out in op.outputs}
    for feature in fdesc.output:
        if feature.type.WhichOneof("Type") != "multiArrayType":
            continue
        vt = producers.get(feature.name)
        if vt is None and feature.name not in block.outputs:
            problems.append(f"output {feature.name!r} is declared but the program returns no such value")
            continue
        if vt is not None:
            problems.extend(_disagreements("output", feature.name, feature.type.multiArrayType, _program_type(vt)))
    return problems
