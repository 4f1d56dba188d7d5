"""Where a function keeps its persistent state (its layout), whether every state is written back, and the
Neural Engine finding about recurrent state held as MLState.

Read from the saved spec only (no model load). A persistent state is a Core ML state
(MLState) or an input/output pair (``x`` -> ``x_out``, ``new_x``, ``present_x`` ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

__all__ = ["ANE_FINDING", "KV_NAME", "LAYOUT_NAMES", "io_pairs", "state_layout", "threading_problems"]

KV_NAME: Final = re.compile(r"(key|value|kv|k_cache|v_cache|past)", re.IGNORECASE)
_ONE_SIDE: Final = re.compile(r"(key|value|(?:^|_)[kv]_cache)", re.IGNORECASE)  # a state of keys or of values only
_PASS_THROUGH_OPS: Final = {"cast", "reshape", "squeeze", "expand_dims", "identity", "transpose"}
#: ``all-mlstate`` every persistent state is an MLState; ``kv-mlstate`` the KV cache is, the rest are
#: input/output pairs (``unified-kv``: keys and values in one such state); ``all-io`` none is; ``mixed``
#: anything else; ``none`` no persistent state
LAYOUT_NAMES: Final = ("all-mlstate", "kv-mlstate", "unified-kv", "all-io", "mixed", "none")
ANE_FINDING: Final = (
    "reported to compile but fail at run time on the Neural Engine: john-rocky/CoreML-LLM "
    "docs/LFM2_CONVERSION_FINDINGS.md (KV cache plus conv state as MLState: ANEProgramProcessRequestDirect "
    "status 0x1d) and docs/QWEN35_LESSONS.md 9.1 (three states per chunk audit as 100% ANE, then Error=11); "
    "the layout that runs there keeps only the KV cache in MLState and passes the other states as "
    "input/output tensors (specproof bundle export --layout kv-mlstate)"
)


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def dims(self) -> tuple[object, ...]: ...


def io_pairs(inputs: Sequence[_Named], outputs: Sequence[_Named]) -> dict[str, str]:
    """Input name -> the output that returns its next value (``x_out``, ``new_x``, ``present_x`` ...)."""
    out_names = [o.name for o in outputs]
    pairs = {}
    for t in inputs:
        base = t.name
        candidates = [f"{base}_out", f"new_{base}", f"{base}_new", f"updated_{base}", f"{base}_next"]
        if base.startswith("past_"):
            candidates.append("present_" + base[len("past_") :])
        if base.startswith("in_"):
            candidates.append("out_" + base[len("in_") :])
        found = [c for c in candidates if c in out_names]
        if found:
            pairs[base] = found[0]
    return pairs


def state_layout(
    inputs: Sequence[_Named], outputs: Sequence[_Named], states: Sequence[_Named]
) -> tuple[str, tuple[str, ...]]:
    """The layout name (``LAYOUT_NAMES``) and the warnings it earns."""
    pairs = io_pairs(inputs, outputs)
    kv_ml = [s.name for s in states if KV_NAME.search(s.name)]
    other_ml = [s.name for s in states if not KV_NAME.search(s.name)]
    if not states and not pairs:
        layout = "none"
    elif not pairs:
        layout = "all-mlstate"
    elif not states:
        layout = "all-io"
    elif kv_ml and not other_ml and not [n for n in pairs if KV_NAME.search(n)]:
        layout = "unified-kv" if len(kv_ml) == 1 and not _ONE_SIDE.search(kv_ml[0]) else "kv-mlstate"
    else:
        layout = "mixed"
    warnings = []
    if other_ml:
        plural = "s" if len(other_ml) > 1 else ""
        warnings.append(
            f"{len(other_ml)} non-KV state{plural} held as MLState ({', '.join(other_ml)})"
            + (f" next to the KV cache ({', '.join(kv_ml)})" if kv_ml else "")
            + f": this layout is {ANE_FINDING}"
        )
    return layout, tuple(warnings)


def _operations(block: Any) -> Iterator[Any]:
    for op in block.operations:
        yield op
        for sub in op.blocks:
            yield from _operations(sub)


def _first_arg(op: Any, key: str) -> str | None:
    arg = op.inputs.get(key)
    if arg is None or not arg.arguments or not arg.arguments[0].HasField("name"):
        return None
    return str(arg.arguments[0].name)


def _passes_through(name: str, producers: Mapping[str, Any], source: str) -> bool:
    """Whether output ``name`` is input ``source`` unchanged (up to casts, reshapes, identities)."""
    op = producers.get(name)
    for _ in range(16):
        if op is None or op.type not in _PASS_THROUGH_OPS:
            return False
        arg = _first_arg(op, "x")
        if arg == source:
            return True
        if arg is None:
            return False
        op = producers.get(arg)
    return False


def _dims(vt: Any) -> tuple[object, ...] | None:
    """A MIL value type's dims (``"?"`` for a symbolic one); None when it is not a tensor."""
    if vt.WhichOneof("type") != "tensorType":
        return None
    return tuple(d.constant.size if d.WhichOneof("dimension") == "constant" else "?" for d in vt.tensorType.dimensions)


def _reads_back(name: str, producers: Mapping[str, Any], state: str) -> bool:
    """Whether var ``name`` is the value ``read_state`` gave for ``state`` (up to casts, reshapes, identities)."""
    op = producers.get(name)
    for _ in range(16):
        if op is None:
            return False
        if op.type == "read_state":
            return _first_arg(op, "input") == state
        if op.type not in _PASS_THROUGH_OPS:
            return False
        arg = _first_arg(op, "x")
        if arg is None:
            return False
        op = producers.get(arg)
    return False


def _write_problems(states: Sequence[_Named], block: Any, producers: Mapping[str, Any]) -> tuple[set[str], list[str]]:
    """(states written with a new value, problems): a write of the value read (a no-op) or of another shape."""
    shapes = {s.name: tuple(s.dims) for s in states}
    written, problems = set(), []
    for op in _operations(block):
        if op.type not in ("write_state", "coreml_update_state"):
            continue
        state = _first_arg(op, "input" if op.type == "write_state" else "state")
        value = _first_arg(op, "data" if op.type == "write_state" else "value")
        if state is None or value is None:
            continue
        if _reads_back(value, producers, state):
            problems.append(f"state {state!r} is written back with the value read from it (a no-op write)")
            continue
        source = producers.get(value)
        vt = next((o.type for o in source.outputs if o.name == value), None) if source is not None else None
        dims = _dims(vt) if vt is not None else None
        if dims is not None and state in shapes and dims != shapes[state]:
            problems.append(f"state {state!r} {list(shapes[state])} is written with a value of shape {list(dims)}")
            continue
        written.add(state)
    return written, problems


def threading_problems(
    inputs: Sequence[_Named], outputs: Sequence[_Named], states: Sequence[_Named], block: Any
) -> tuple[list[str], list[str]]:
    """(states written back, problems): an MLState never written (``write_state``), written with the value read
    from it (a no-op write) or with a value of another shape; an input/output pair whose output has another
    shape or dtype than its input, or is the input passed through."""
    # the saved program writes a state with ``write_state`` (``coreml_update_state`` in the MIL builder)
    producers = {out.name: op for op in _operations(block) for out in op.outputs}
    written, problems = _write_problems(states, block, producers)
    attempted = {
        _first_arg(op, "input" if op.type == "write_state" else "state")
        for op in _operations(block)
        if op.type in ("write_state", "coreml_update_state")
    }
    ok = []
    for s in states:
        if s.name in written:
            ok.append(s.name)
        elif s.name not in attempted:
            problems.append(f"state {s.name!r} is read but never written back (no coreml_update_state)")
    by_name = {o.name: o for o in outputs}
    for name, out_name in io_pairs(inputs, outputs).items():
        src = next(t for t in inputs if t.name == name)
        out = by_name[out_name]
        if (src.dtype, tuple(src.dims)) != (out.dtype, tuple(out.dims)):
            problems.append(
                f"{out_name!r} {out.dtype} {list(out.dims)} cannot be fed back as {name!r} {src.dtype} {list(src.dims)}"
            )
        elif _passes_through(out_name, producers, name):
            problems.append(f"{out_name!r} is {name!r} passed through unchanged: the state is never updated")
        else:
            ok.append(f"{name} -> {out_name}")
    return ok, problems
