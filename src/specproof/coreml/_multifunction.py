"""The multifunction export: fixed-shape ``decode`` (q = 1) and ``verify`` (q = K + 1) functions sharing weights.

What exporters that run on the Neural Engine write (anemll, CoreML-LLM): one fixed token shape per
function, since a range-shaped function runs there only at its default shape (docs/coreml.md,
"Where a layout runs"). Each function is the program ``build_program`` writes for exactly its q
tokens (an unrolled delta rule of exactly q steps); both are converted, then merged with
coremltools' ``MultiFunctionDescriptor`` / ``save_multifunction``, which deduplicates the
constants the functions share (every weight) by hash. Both functions read and write the same
states (names, shapes, layout): a host threads one set of states through whichever function
fits the chunk. ``decode`` is the default function.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Final

from specproof.contract.errors import InvalidSettingError
from specproof.coreml._export import ExportResult, _dir_bytes, convert_program, export_metadata
from specproof.coreml._options import ExportOptions
from specproof.coreml._program import build_program, check_exportable
from specproof.engine.targets.coreml import import_coremltools
from specproof.engine.targets.reference import ReferenceHybrid

__all__ = ["DECODE", "VERIFY", "export_multifunction", "function_sizes"]

DECODE: Final = "decode"
VERIFY: Final = "verify"


def function_sizes(k: int) -> dict[str, int]:
    """Function name -> its fixed token count: ``decode`` 1, ``verify`` K + 1."""
    return {DECODE: 1, VERIFY: k + 1}


def _check(target: object, k: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidSettingError(f"bundle export --multifunction: k={k!r} must be an integer >= 1")
    if not isinstance(target, ReferenceHybrid):
        raise InvalidSettingError(
            f"bundle export: the target must be a ReferenceHybrid (a reference spec), got {type(target).__name__}"
        )
    check_exportable(target.config)
    if k + 1 > target.max_context:
        raise InvalidSettingError(
            f"bundle export --multifunction: k + 1 = {k + 1} exceeds the target's max_context={target.max_context}"
        )


def export_multifunction(
    path: str | Path,
    target: ReferenceHybrid,
    *,
    k: int = 4,
    target_spec: str = "",
    layout: str = "all-mlstate",
    gdn: str = "unrolled",
    positions: str = "scalar",
    _planted: str | None = None,
) -> ExportResult:
    """Write ``target`` at ``path`` as a multifunction ``.mlpackage``: ``decode`` ([1, 1] ids) and ``verify``
    ([1, K + 1] ids) sharing weights and states; ``positions`` as ``export_bundle``'s. ``_planted`` is TEST-ONLY
    (``export_bundle``'s)."""
    options = ExportOptions(layout=layout, gdn=gdn, planted=_planted, positions=positions)
    _check(target, k)
    out = Path(path)
    if out.suffix != ".mlpackage":
        raise InvalidSettingError(f"bundle export: {str(out)!r} must end in .mlpackage")
    ct = import_coremltools("Core ML export")
    t0 = time.perf_counter()
    sizes = function_sizes(k)
    with tempfile.TemporaryDirectory(prefix="specproof-multifunction-") as tmp:
        desc = ct.utils.MultiFunctionDescriptor()
        for name, q in sizes.items():
            prog = build_program(target, max_query=q, options=options, fixed_query=q)
            model = convert_program(prog, target.config, layout=layout, tokens=q, positions=positions)
            part = Path(tmp) / f"{name}.mlpackage"
            model.save(str(part))
            desc.add_function(str(part), src_function_name="main", target_function_name=name)
        desc.default_function_name = DECODE
        merged = Path(tmp) / "merged.mlpackage"
        ct.utils.save_multifunction(desc, str(merged))
        # the metadata goes on the merged package (save_multifunction keeps none); saved where it belongs
        model = ct.models.MLModel(str(merged), skip_model_load=True)
        meta = export_metadata(target, target_spec=target_spec, options=options, max_query=k + 1)
        meta["functions"] = ",".join(f"{name}:{q}" for name, q in sizes.items())
        for key, value in meta.items():
            model.user_defined_metadata[f"specproof.{key}"] = value
        model.short_description = (
            f"specproof multifunction export of {target.describe()}: decode (1 token), verify ({k + 1} tokens)"
        )
        model.save(str(out))
    return ExportResult(
        path=out,
        target_spec=target_spec or "reference",
        config=target.config,
        max_query=k + 1,
        last_token_only=False,
        layout=layout,
        gdn=meta["gdn"],
        bytes=_dir_bytes(out),
        seconds=time.perf_counter() - t0,
    )
