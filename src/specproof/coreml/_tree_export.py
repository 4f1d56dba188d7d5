"""``bundle export --tree N``: the chain functions plus a ``verify_tree`` function of N nodes in one package.

The chain functions are the ones the export writes without ``--tree`` (``main``, range-shaped; or with
``--multifunction`` the fixed ``decode`` and ``verify``); ``verify_tree`` is ``_tree.build_tree_program``
(inputs ``input_ids [1, N]``, ``parents [N]``, ``position [1]``; the states read, never written; per-node
KV rows and states out for the host to commit). All are merged with coremltools' ``save_multifunction``,
which stores the shared weights once. Metadata ``specproof.tree`` = ``verify_tree:N``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from specproof.contract.errors import InvalidSettingError
from specproof.contract.tree import MAX_TREE_NODES
from specproof.coreml._export import ExportResult, _check_sizes, _dir_bytes, convert_program, export_metadata
from specproof.coreml._multifunction import DECODE, function_sizes
from specproof.coreml._options import ExportOptions
from specproof.coreml._program import build_program
from specproof.coreml._tree import build_tree_program
from specproof.engine.targets.coreml import import_coremltools
from specproof.engine.targets.coreml_eval_tree import TREE_FUNCTION
from specproof.engine.targets.reference import ReferenceHybrid

__all__ = ["check_tree_nodes", "export_tree"]


def check_tree_nodes(nodes: object, target: object) -> int:
    """``nodes`` as the tree function's size, or ``InvalidSettingError`` naming what is wrong with it."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 2 <= nodes <= MAX_TREE_NODES:
        raise InvalidSettingError(
            f"bundle export --tree {nodes!r}: the tree's node count must be an integer in [2, {MAX_TREE_NODES}] "
            "(the pending token and at least one draft node)"
        )
    if isinstance(target, ReferenceHybrid) and nodes > target.max_context:
        raise InvalidSettingError(
            f"bundle export --tree {nodes}: more nodes than the target's max_context={target.max_context}"
        )
    return nodes


def _chain_programs(
    target: ReferenceHybrid, *, k: int, multifunction: bool, max_query: int | None, options: ExportOptions
) -> dict[str, tuple[Any, Any]]:
    """Function name -> (program, token length for conversion) of the chain functions."""
    if multifunction:
        return {
            name: (build_program(target, max_query=q, options=options, fixed_query=q), q)
            for name, q in function_sizes(k).items()
        }
    ct = import_coremltools("Core ML export")
    mq = _check_sizes(target, k, max_query, options)
    return {"main": (build_program(target, max_query=mq, options=options), ct.RangeDim(1, mq, default=1))}


def export_tree(
    path: str | Path,
    target: ReferenceHybrid,
    *,
    nodes: int,
    k: int = 4,
    multifunction: bool = False,
    max_query: int | None = None,
    target_spec: str = "",
    layout: str = "all-mlstate",
    gdn: str = "unrolled",
    _planted: str | None = None,
) -> ExportResult:
    """Write ``target`` at ``path`` with its chain functions and a ``verify_tree`` function of ``nodes`` nodes
    (the pending token and up to ``nodes - 1`` draft nodes per forward). ``_planted`` is TEST-ONLY."""
    check_tree_nodes(nodes, target)
    options = ExportOptions(layout=layout, gdn=gdn, planted=_planted)
    mq = _check_sizes(target, k, k + 1 if multifunction else max_query, options)
    out = Path(path)
    if out.suffix != ".mlpackage":
        raise InvalidSettingError(f"bundle export: {str(out)!r} must end in .mlpackage")
    ct = import_coremltools("Core ML export")
    t0 = time.perf_counter()
    programs = _chain_programs(target, k=k, multifunction=multifunction, max_query=max_query, options=options)
    programs[TREE_FUNCTION] = (build_tree_program(target, nodes=nodes, options=options), nodes)
    with tempfile.TemporaryDirectory(prefix="specproof-tree-") as tmp:
        desc = ct.utils.MultiFunctionDescriptor()
        for name, (prog, tokens) in programs.items():
            part = Path(tmp) / f"{name}.mlpackage"
            convert_program(prog, target.config, layout=layout, tokens=tokens).save(str(part))
            desc.add_function(str(part), src_function_name="main", target_function_name=name)
        desc.default_function_name = DECODE if multifunction else "main"
        merged = Path(tmp) / "merged.mlpackage"
        ct.utils.save_multifunction(desc, str(merged))
        model = ct.models.MLModel(str(merged), skip_model_load=True)
        meta = export_metadata(target, target_spec=target_spec, options=options, max_query=mq)
        if multifunction:
            meta["functions"] = ",".join(f"{name}:{q}" for name, q in function_sizes(k).items())
        meta["tree"] = f"{TREE_FUNCTION}:{nodes}"
        for key, value in meta.items():
            model.user_defined_metadata[f"specproof.{key}"] = value
        model.short_description = (
            f"specproof export of {target.describe()}: chain functions {', '.join(programs)[: -len(TREE_FUNCTION) - 2]}"
            f" and {TREE_FUNCTION} (a token tree of {nodes} nodes in one forward)"
        )
        model.save(str(out))
    return ExportResult(
        path=out,
        target_spec=target_spec or "reference",
        config=target.config,
        max_query=mq,
        last_token_only=False,
        layout=layout,
        gdn=meta["gdn"],
        bytes=_dir_bytes(out),
        seconds=time.perf_counter() - t0,
    )
