"""Read a Core ML bundle's interface (no model load) and decide whether it can verify K draft tokens.

``inspect_bundle(path, k=K)`` reads the spec of an ``.mlpackage`` (or ``.mlmodel``)
with coremltools, lists every function's inputs (dtype; fixed, range or enumerated
shapes), outputs (rank and each dimension, fixed or symbolic, from the ML program
itself, since the interface description leaves flexible output shapes empty) and
states, and gives each function a verdict made of these rules:

- ``ml-program``: the function is an ML program (only ML programs carry states);
- ``token-input``: an integer token-id input accepts a length of K+1;
- ``logits``: a float logits output keeps a per-position sequence dimension
  (not ``[1, 1, vocab]``, not an in-graph argmax);
- ``kv-state`` / ``recurrent-state``: the KV cache and the recurrent (conv / SSM /
  delta-rule) state persist between calls, as states or as input/output pairs;
- ``states-threaded`` (ML programs): every Core ML state is written back
  (``coreml_update_state``) and every input/output state pair returns a value of the
  input's shape and dtype that is not the input passed through;
- ``position``: an input tells the bundle where the chunk starts (or a mask that does);
- ``declared-types`` (ML programs): every declared input, state and output has the dtype and
  shape of the program's (``_declared.py``); ``states-threaded`` also fails a state written
  with the value read from it (a no-op write) or with a value of another shape.

A bundle qualifies when at least one function passes every rule. Each function also gets
its state layout (``all-mlstate``, ``kv-mlstate``, ...; ``_layout.py``) and warnings: a
non-KV state held as MLState is reported to fail at run time on the Neural Engine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from specproof.contract.errors import SpecproofError
from specproof.contract.validation import int_at_least
from specproof.coreml._declared import declared_problems
from specproof.coreml._layout import KV_NAME, io_pairs, state_layout, threading_problems
from specproof.coreml._positions import position_layout
from specproof.coreml._tree_inspect import TreeVerdict, tree_rules, tree_verdict
from specproof.coreml._units import ComputeUnits, compute_units
from specproof.engine.targets.coreml import import_coremltools
from specproof.formats import bundle_inspect as bundle_inspect_format

__all__ = [
    "BundleReadError",
    "BundleReport",
    "FunctionReport",
    "RuleResult",
    "TensorInfo",
    "inspect_bundle",
]


class BundleReadError(SpecproofError):
    """The path is not a readable Core ML bundle (missing, not an ``.mlpackage``, a corrupt spec)."""


# specificationVersion -> the OS release that introduced it
_DEPLOYMENT: Final[dict[int, str]] = {
    4: "iOS 13 / macOS 10.15",
    5: "iOS 14 / macOS 11",
    6: "iOS 15 / macOS 12",
    7: "iOS 16 / macOS 13",
    8: "iOS 17 / macOS 14",
    9: "iOS 18 / macOS 15",
    10: "iOS 26 / macOS 26",
}

_INT_TYPES: Final = {"INT32", "INT16", "INT8", "UINT8", "UINT16", "INT64"}
_FLOAT_TYPES: Final = {"FLOAT16", "FLOAT32", "FLOAT64", "DOUBLE", "BFLOAT16"}
_TOKEN_NAME = re.compile(r"(input_?ids|token|^ids$|^input$|^x$)", re.IGNORECASE)
_POSITION_NAME = re.compile(
    r"(position|^pos|_pos$|offset|cache_len|past_len|seq_start|start|processed|current|step|mask)", re.IGNORECASE
)
_KV_NAME = KV_NAME
_REC_NAME = re.compile(r"(conv|rec|ssm|recurrent|hidden|delta|state)", re.IGNORECASE)
_ARGMAX_OPS: Final = {"reduce_argmax", "reduce_argmin", "topk", "argsort"}
_PASS_THROUGH_OPS: Final = {"cast", "reshape", "squeeze", "expand_dims", "identity", "transpose"}


@attrs.frozen(kw_only=True)
class TensorInfo:
    """One input, output or state of a function.

    ``kind``: ``input`` | ``output`` | ``state``; ``shape_kind``: ``fixed`` | ``range`` |
    ``enumerated`` | ``symbolic`` (an output with a dimension only known at run time).
    ``dims``: per dimension an int, ``"?"`` (symbolic) or ``"LO..HI"`` (a range, HI -1 = unbounded).
    """

    name: str
    kind: str
    dtype: str
    shape_kind: str
    dims: tuple[object, ...]
    enumerated: tuple[tuple[int, ...], ...] = ()
    producer: str = ""  # the op type that computes an output

    def shape_text(self) -> str:
        text = "[" + ", ".join(str(d) for d in self.dims) + "]"
        if self.enumerated:
            text += " one of " + " ".join("[" + ",".join(map(str, s)) + "]" for s in self.enumerated)
        return text

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "dtype": self.dtype,
            "shape_kind": self.shape_kind,
            "dims": list(self.dims),
        }
        if self.enumerated:
            out["enumerated"] = [list(s) for s in self.enumerated]
        if self.producer:
            out["producer"] = self.producer
        return out


@attrs.frozen(kw_only=True)
class RuleResult:
    """One rule of the verify-qualification verdict: its id, whether it passed, what was found, why it matters."""

    id: str
    passed: bool
    detail: str
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "passed": self.passed, "detail": self.detail, "why": self.why}


@attrs.frozen(kw_only=True)
class FunctionReport:
    name: str
    default: bool
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    states: tuple[TensorInfo, ...]
    rules: tuple[RuleResult, ...]
    state_layout: str = "none"  # coreml._layout.LAYOUT_NAMES
    warnings: tuple[str, ...] = ()  # advisories that do not fail the verdict (the Neural Engine finding)
    compute_units: ComputeUnits | None = None  # what its input shapes allow (coreml._units)
    position_layout: str = "none"  # coreml._positions.POSITION_LAYOUTS: scalar position [1], seed position_ids
    tree: TreeVerdict | None = None  # can it verify a token tree in one forward (coreml._tree_inspect)

    @property
    def qualifies(self) -> bool:
        return all(r.passed for r in self.rules)

    @property
    def failed(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.rules if not r.passed)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "default": self.default,
            "qualifies": self.qualifies,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "states": [t.to_json() for t in self.states],
            "rules": [r.to_json() for r in self.rules],
            "state_layout": self.state_layout,
            "position_layout": self.position_layout,
            "warnings": list(self.warnings),
            **({"compute_units": self.compute_units.to_json()} if self.compute_units else {}),
            **({"tree": self.tree.to_json()} if self.tree else {}),
        }


@attrs.frozen(kw_only=True)
class BundleReport:
    """The interface and the per-function verdicts of one bundle, for a verify forward of ``k`` draft tokens."""

    path: str
    k: int
    model_type: str
    specification_version: int
    deployment_target: str
    opset: str
    metadata: dict[str, str]
    functions: tuple[FunctionReport, ...]

    @property
    def qualifies(self) -> bool:
        """At least one function can run a K-token verify forward."""
        return any(f.qualifies for f in self.functions)

    @property
    def exit_code(self) -> int:
        return 0 if self.qualifies else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "format": bundle_inspect_format.ID,
            "path": self.path,
            "k": self.k,
            "qualifies": self.qualifies,
            "qualifying_functions": [f.name for f in self.functions if f.qualifies],
            "tree_functions": [f.name for f in self.functions if f.tree is not None and f.tree.verifies_tree],
            "model_type": self.model_type,
            "specification_version": self.specification_version,
            "deployment_target": self.deployment_target,
            "opset": self.opset,
            "metadata": dict(self.metadata),
            "functions": [f.to_json() for f in self.functions],
        }


# --------------------------------------------------------------------------- reading


def _load_spec(path: Path) -> Any:
    ct = import_coremltools("bundle inspect")
    if not path.exists():
        raise BundleReadError(f"{str(path)!r}: no such file or directory")
    if path.is_dir():
        if not (path / "Manifest.json").is_file():
            raise BundleReadError(f"{str(path)!r} is a directory but not an .mlpackage (it has no Manifest.json)")
    elif path.suffix not in (".mlmodel", ".mlpackage"):
        raise BundleReadError(
            f"{str(path)!r} is a file but not a Core ML model (.mlpackage directory or .mlmodel file)"
        )
    try:
        return ct.utils.load_spec(str(path))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BundleReadError(f"{str(path)!r}: corrupt Core ML spec ({type(exc).__name__}: {first})") from None


def _feature_input(feature: Any) -> TensorInfo:
    t = feature.type
    which = t.WhichOneof("Type")
    if which != "multiArrayType":
        return TensorInfo(name=feature.name, kind="input", dtype=which or "?", shape_kind="fixed", dims=())
    arr = t.multiArrayType
    from coremltools.proto import FeatureTypes_pb2 as ft

    dtype = ft.ArrayFeatureType.ArrayDataType.Name(arr.dataType)
    flex = arr.WhichOneof("ShapeFlexibility")
    if flex == "shapeRange":
        ranges = arr.shapeRange.sizeRanges
        dims: tuple[object, ...] = tuple(
            r.lowerBound if r.lowerBound == r.upperBound else f"{r.lowerBound}..{r.upperBound}" for r in ranges
        )
        kind = "range" if any(r.lowerBound != r.upperBound for r in ranges) else "fixed"
        return TensorInfo(name=feature.name, kind="input", dtype=dtype, shape_kind=kind, dims=dims)
    if flex == "enumeratedShapes":
        shapes = tuple(tuple(int(s) for s in e.shape) for e in arr.enumeratedShapes.shapes)
        return TensorInfo(
            name=feature.name,
            kind="input",
            dtype=dtype,
            shape_kind="enumerated",
            dims=tuple(int(s) for s in arr.shape),
            enumerated=shapes,
        )
    return TensorInfo(
        name=feature.name, kind="input", dtype=dtype, shape_kind="fixed", dims=tuple(int(s) for s in arr.shape)
    )


def _mil_tensor(name: str, kind: str, vt: Any, producer: str = "") -> TensorInfo:
    from coremltools.proto import MIL_pb2

    which = vt.WhichOneof("type")
    if which == "stateType":
        vt = vt.stateType.wrappedType
        which = vt.WhichOneof("type")
    if which != "tensorType":
        return TensorInfo(name=name, kind=kind, dtype=which or "?", shape_kind="fixed", dims=(), producer=producer)
    tt = vt.tensorType
    dims: list[object] = []
    for d in tt.dimensions:
        dims.append(d.constant.size if d.WhichOneof("dimension") == "constant" else "?")
    dtype = MIL_pb2.DataType.Name(tt.dataType)
    shape_kind = "symbolic" if "?" in dims else "fixed"
    return TensorInfo(name=name, kind=kind, dtype=dtype, shape_kind=shape_kind, dims=tuple(dims), producer=producer)


def _producers(block: Any) -> dict[str, Any]:
    return {out.name: op for op in block.operations for out in op.outputs}


def _origin_op(name: str, producers: dict[str, Any]) -> str:
    """The op type behind an output, looking through casts and reshapes (an argmax stays an argmax)."""
    seen = 0
    op = producers.get(name)
    while op is not None and seen < 16:
        if op.type not in _PASS_THROUGH_OPS:
            return str(op.type)
        args = op.inputs.get("x")
        if args is None or not args.arguments or not args.arguments[0].HasField("name"):
            return str(op.type)
        op = producers.get(args.arguments[0].name)
        seen += 1
    return "" if op is None else str(op.type)


# --------------------------------------------------------------------------- rules


def _accepts(info: TensorInfo, length: int) -> tuple[bool, str]:
    """Whether the sequence (last) dimension of ``info`` accepts ``length``, and how its shapes are declared."""
    if not info.dims and not info.enumerated:
        return False, "it has no shape"
    if info.shape_kind == "enumerated":
        ok = any(s and s[-1] == length for s in info.enumerated)
        lengths = sorted({s[-1] for s in info.enumerated if s})
        return ok, f"enumerated lengths {lengths}"
    last = info.dims[-1]
    if isinstance(last, str) and ".." in last:
        lo, hi = (int(v) for v in last.split(".."))
        return lo <= length and (hi < 0 or length <= hi), f"a range {lo}..{'unbounded' if hi < 0 else hi}"
    if last == "?":
        return True, "a symbolic length"
    return last == length, f"a fixed length {last}"


def _rule_program(model_type: str) -> RuleResult:
    if model_type == "mlProgram":
        return RuleResult(id="ml-program", passed=True, detail="an ML program")
    return RuleResult(
        id="ml-program",
        passed=False,
        detail=f"a {model_type or 'unknown'} model",
        why="only ML programs (iOS 15+) can carry states; a stateful verify forward needs an iOS 18 ML program",
    )


def _rule_token_input(inputs: Sequence[TensorInfo], k: int) -> tuple[RuleResult, TensorInfo | None]:
    ints = [t for t in inputs if t.dtype in _INT_TYPES and not _POSITION_NAME.search(t.name)]
    named = [t for t in ints if _TOKEN_NAME.search(t.name)]
    ranked = named or [t for t in ints if len(t.dims) >= 2] or ints
    token = ranked[0] if ranked else None
    why = (
        f"a verify forward feeds the pending token plus {k} draft tokens ({k + 1} ids) in one call; "
        "a bundle that takes fewer must verify token by token, which costs a full weight read per draft token"
    )
    if token is None:
        return RuleResult(id="token-input", passed=False, detail="no integer token-id input", why=why), None
    ok, how = _accepts(token, k + 1)
    verdict = "accepts" if ok else "does not accept"
    return (
        RuleResult(
            id="token-input",
            passed=ok,
            detail=f"{token.name!r} {token.shape_text()}: {how}, {verdict} length K+1={k + 1}",
            why="" if ok else why,
        ),
        token,
    )


def _rule_logits(outputs: Sequence[TensorInfo], k: int) -> RuleResult:
    floats = [t for t in outputs if t.dtype in _FLOAT_TYPES]
    why_rows = (
        "the accept rule compares each draft token with the target's argmax at its own position, and the "
        "tie-aware lossless check needs each row's top-2 margin: a verify forward must return one logit row "
        f"per input position ({k + 1} rows)"
    )
    argmaxed = [t for t in outputs if t.producer in _ARGMAX_OPS]
    if argmaxed and not [t for t in floats if t not in argmaxed]:
        t = argmaxed[0]
        return RuleResult(
            id="logits",
            passed=False,
            detail=f"{t.name!r} {t.dtype} {t.shape_text()} comes from an in-graph {t.producer}; no logits are returned",
            why="an in-graph argmax hides the logits: no top-2 margins (tie-aware checks), no sampling, "
            "no comparison with a reference within a tolerance",
        )
    if not floats:
        names = ", ".join(f"{t.name} ({t.dtype})" for t in outputs) or "none"
        return RuleResult(id="logits", passed=False, detail=f"no float output (outputs: {names})", why=why_rows)
    named = [t for t in floats if "logit" in t.name.lower()]
    logits = (named or floats)[0]
    dims = logits.dims
    if len(dims) < 2:
        return RuleResult(
            id="logits",
            passed=False,
            detail=f"{logits.name!r} {logits.shape_text()} has no sequence dimension",
            why=why_rows,
        )
    seq = dims[-2]
    if seq == "?":
        return RuleResult(
            id="logits",
            passed=True,
            detail=f"{logits.name!r} {logits.dtype} {logits.shape_text()}: per-position rows "
            "(length follows the input)",
        )
    if isinstance(seq, int) and seq >= k + 1:
        return RuleResult(
            id="logits", passed=True, detail=f"{logits.name!r} {logits.shape_text()}: {seq} rows per forward"
        )
    detail = f"{logits.name!r} {logits.dtype} {logits.shape_text()}: a fixed sequence dimension of {seq}"
    if seq == 1:
        detail += " (last-token-only logits)"
    return RuleResult(id="logits", passed=False, detail=detail, why=why_rows)


def _state_like(inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], states: Sequence[TensorInfo]) -> list[str]:
    """Names of persistent state: Core ML states, plus input/output pairs (x -> x_out / new_x / present_x ...)."""
    return [s.name for s in states] + list(io_pairs(inputs, outputs))


def _rule_threaded(
    inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], states: Sequence[TensorInfo], block: Any
) -> RuleResult:
    ok, problems = threading_problems(inputs, outputs, states, block)
    if problems:
        return RuleResult(
            id="states-threaded",
            passed=False,
            detail="; ".join(problems),
            why="a state that is not written back (or an output state that cannot be fed back as its input) "
            "makes the next forward start from a stale state: chunked and one-token forwards then disagree",
        )
    return RuleResult(
        id="states-threaded",
        passed=True,
        detail=f"written back: {', '.join(ok)}" if ok else "no persistent state to thread",
    )


def _rule_states(
    inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], states: Sequence[TensorInfo]
) -> list[RuleResult]:
    persistent = _state_like(inputs, outputs, states)
    kv = [n for n in persistent if _KV_NAME.search(n)]
    rec = [n for n in persistent if n not in kv and _REC_NAME.search(n)]
    found = ", ".join(persistent) or "none"
    return [
        RuleResult(
            id="kv-state",
            passed=bool(kv),
            detail=f"KV cache: {', '.join(kv)}" if kv else f"no KV cache among the persistent state ({found})",
            why=""
            if kv
            else "without a KV cache carried between calls, each verify forward would re-read the whole "
            "context: the bundle cannot continue from the accepted prefix",
        ),
        RuleResult(
            id="recurrent-state",
            passed=bool(rec),
            detail=f"recurrent state: {', '.join(rec)}"
            if rec
            else f"no recurrent state among the persistent state ({found})",
            why=""
            if rec
            else "a hybrid model's conv / SSM / delta-rule layers must resume from the accepted prefix; "
            "with no recurrent state in or out, rollback after a rejected draft token is impossible",
        ),
    ]


def _rule_declared(problems: Sequence[str]) -> RuleResult:
    if problems:
        return RuleResult(
            id="declared-types",
            passed=False,
            detail="; ".join(problems),
            why="Core ML and every host loop read the declared interface, the program runs its own types: a "
            "bundle whose two disagree is refused at load time or fed tensors of the wrong shape",
        )
    return RuleResult(id="declared-types", passed=True, detail="every declared input, state and output as the program")


def _position_input(inputs: Sequence[TensorInfo], token: TensorInfo | None) -> TensorInfo | None:
    """The input that tells the bundle where the chunk starts (a position, offset or mask), if any."""
    return next((t for t in inputs if t is not token and _POSITION_NAME.search(t.name)), None)


def _rule_position(inputs: Sequence[TensorInfo], token: TensorInfo | None) -> RuleResult:
    t = _position_input(inputs, token)
    if t is not None:
        return RuleResult(id="position", passed=True, detail=f"{t.name!r} {t.dtype} {t.shape_text()}")
    return RuleResult(
        id="position",
        passed=False,
        detail="no position, offset or mask input",
        why="after a rollback the engine re-feeds tokens at an earlier position: the bundle must be told where "
        "the chunk starts (which KV slots to write, which RoPE angles to use)",
    )


# --------------------------------------------------------------------------- the report


def inspect_bundle(path: str | Path, *, k: int = 4) -> BundleReport:
    """Read the bundle at ``path`` (no model load) and judge each function for a verify forward of ``k`` drafts.

    Raises ``BundleReadError`` when the path is not a readable bundle and
    ``InvalidSettingError`` for ``k < 1``.
    """
    int_at_least(k, name="k", minimum=1, where="bundle inspect")
    p = Path(path)
    spec = _load_spec(p)
    model_type = spec.WhichOneof("Type") or ""
    version = int(spec.specificationVersion)
    desc = spec.description
    metadata = {str(key): str(val) for key, val in desc.metadata.userDefined.items()}
    functions: list[FunctionReport] = []
    opset = ""
    if model_type == "mlProgram":
        described = {f.name: f for f in desc.functions}
        default = desc.defaultFunctionName or "main"
        for fname, func in spec.mlProgram.functions.items():
            opset = func.opset
            fdesc = described.get(fname, desc)
            block = func.block_specializations[func.opset]
            producers = _producers(block)
            flex = {f.name: _feature_input(f) for f in fdesc.input}
            inputs: list[TensorInfo] = []
            states: list[TensorInfo] = []
            for nv in func.inputs:
                if nv.type.WhichOneof("type") == "stateType":
                    states.append(_mil_tensor(nv.name, "state", nv.type))
                else:
                    inputs.append(flex.get(nv.name) or _mil_tensor(nv.name, "input", nv.type))
            outputs = []
            for out_name in block.outputs:
                op = producers.get(out_name)
                vt = next((o.type for o in op.outputs if o.name == out_name), None) if op is not None else None
                if vt is None:
                    outputs.append(TensorInfo(name=out_name, kind="output", dtype="?", shape_kind="fixed", dims=()))
                else:
                    outputs.append(_mil_tensor(out_name, "output", vt, _origin_op(out_name, producers)))
            functions.append(
                _judge(
                    fname,
                    fname == default or len(spec.mlProgram.functions) == 1,
                    inputs,
                    outputs,
                    states,
                    k,
                    model_type,
                    block,
                    declared_problems(fdesc, func, block),
                )
            )
    else:
        inputs = [_feature_input(f) for f in desc.input]
        outputs = [_feature_input(f) for f in desc.output]
        outputs = [attrs.evolve(o, kind="output") for o in outputs]
        functions.append(_judge("main", True, inputs, outputs, [], k, model_type))
    return BundleReport(
        path=str(p),
        k=k,
        model_type=model_type,
        specification_version=version,
        deployment_target=_DEPLOYMENT.get(version, f"specification version {version}"),
        opset=opset,
        metadata=metadata,
        functions=tuple(functions),
    )


def _judge(
    name: str,
    default: bool,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    states: Sequence[TensorInfo],
    k: int,
    model_type: str,
    block: Any = None,
    declared: Sequence[str] | None = None,
) -> FunctionReport:
    token_rule, token = _rule_token_input(inputs, k)
    rules = [
        _rule_program(model_type),
        token_rule,
        _rule_logits(outputs, k),
        *_rule_states(inputs, outputs, states),
        *([_rule_threaded(inputs, outputs, states, block)] if block is not None else []),
        _rule_position(inputs, token),
        *([_rule_declared(declared)] if declared is not None else []),
    ]
    state_inputs = [*(s.name for s in states), *(t.name for t in inputs if t.dtype in _FLOAT_TYPES)]
    recurrent = [n for n in state_inputs if not _KV_NAME.search(n) and _REC_NAME.search(n)]
    tree = tree_verdict(inputs, outputs, recurrent, token)
    rules = tree_rules(rules, tree)
    layout, warnings = state_layout(inputs, outputs, states)
    return FunctionReport(
        position_layout=position_layout(inputs, _position_input(inputs, token)),
        tree=tree,
        compute_units=compute_units(inputs),
        state_layout=layout,
        warnings=warnings,
        name=name,
        default=default,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        states=tuple(states),
        rules=tuple(rules),
    )
