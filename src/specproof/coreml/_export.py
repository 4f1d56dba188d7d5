"""Export the reference target as a stateful Core ML ML program, and write golden greedy outputs.

``export_bundle`` converts and saves the program ``build_program`` writes (``_program.py``:
the interface and the two state layouts; ``_blocks.py``: conv, attention, Gated DeltaNet,
dense and mixture-of-experts feed-forwards) for any ``ReferenceHybrid`` with at least one
attention block and one conv or GDN block. Weights are stored in fp16 under their Hugging
Face layout (``linear`` takes ``[out, in]``, the depthwise ``conv`` takes ``[C, 1, L]``), so
they can be compared tensor by tensor with ``ReferenceHybrid.weights``. The metadata
(``specproof.*`` keys) records the target, layout, GDN form and sizes for the inspector and
the ``coreml-eval:`` target.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np

from specproof.contract.errors import InvalidSettingError
from specproof.coreml._options import ExportOptions
from specproof.coreml._positions import position_input_type
from specproof.coreml._program import build_program, check_exportable, state_shapes
from specproof.engine.targets.coreml import import_coremltools
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid
from specproof.formats import golden as golden_format

__all__ = [
    "DEFAULT_EXPORT_TARGET",
    "convert_program",
    "export_metadata",
    "DEFAULT_MAX_QUERY",
    "DEFAULT_MAX_QUERY_GDN",
    "GOLDEN_FORMAT",
    "GOLDEN_PROMPTS",
    "ExportResult",
    "build_program",
    "check_exportable",
    "export_bundle",
    "export_config",
    "golden_cases",
    "write_golden",
]

DEFAULT_EXPORT_TARGET: Final = "reference:layers=conv+attn+conv+attn"
DEFAULT_MAX_QUERY: Final = 64
DEFAULT_MAX_QUERY_GDN: Final = 16  # an unrolled delta rule runs max_query steps per call: keep it short
GOLDEN_FORMAT: Final = golden_format.ID
GOLDEN_MAX_NEW_TOKENS: Final = 32

# Fixed prompts for golden outputs: code, prose, a repetition, raw ids across the byte range.
GOLDEN_PROMPTS: Final[tuple[tuple[int, ...], ...]] = (
    tuple(b"def area(width, height):\n    return width * height\n\ndef area("),
    tuple(b"The quick brown fox jumps over the lazy dog. The quick brown"),
    tuple(b"abcabcabcabcabcabc"),
    (7,),
    (0, 255, 128, 64, 32, 16, 8, 4, 2, 1),
)


@attrs.frozen(kw_only=True)
class ExportResult:
    """What ``export_bundle`` wrote: the path, the options, its size on disk and the build time."""

    path: Path
    target_spec: str
    config: ReferenceConfig
    max_query: int
    last_token_only: bool
    layout: str
    gdn: str
    bytes: int
    seconds: float


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _check_sizes(target: object, k: object, max_query: object, options: ExportOptions) -> int:
    """The max_query in force, or ``InvalidSettingError`` naming the bad option."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidSettingError(f"bundle export: k={k!r} must be an integer >= 1")
    if not isinstance(target, ReferenceHybrid):
        raise InvalidSettingError(
            f"bundle export: the target must be a ReferenceHybrid (a reference spec), got {type(target).__name__}"
        )
    check_exportable(target.config)
    unrolled = target.config.n_gdn_layers and options.gdn == "unrolled"
    mq = max(k + 1, DEFAULT_MAX_QUERY_GDN if unrolled else DEFAULT_MAX_QUERY) if max_query is None else max_query
    if isinstance(mq, bool) or not isinstance(mq, int) or mq < k + 1:
        raise InvalidSettingError(f"bundle export: max_query={mq!r} must be an integer >= k + 1 = {k + 1}")
    if mq > target.max_context:
        raise InvalidSettingError(
            f"bundle export: max_query={mq} exceeds the target's max_context={target.max_context}"
        )
    return mq


def export_bundle(
    path: str | Path,
    target: ReferenceHybrid,
    *,
    k: int = 4,
    max_query: int | None = None,
    last_token_only: bool = False,
    target_spec: str = "",
    layout: str = "all-mlstate",
    gdn: str = "unrolled",
    positions: str = "scalar",
    _planted: str | None = None,
) -> ExportResult:
    """Write ``target`` as a stateful ``.mlpackage`` at ``path`` (iOS 18 / macOS 15); return what was written.

    ``max_query`` (default ``max(k + 1, 64)``, 16 with unrolled GDN blocks) bounds the token
    input's length; it must be at least ``k + 1`` so one forward verifies ``k`` draft tokens.
    ``layout``: ``all-mlstate`` or ``kv-mlstate`` (``LAYOUTS``); ``gdn``: ``unrolled`` or ``loop``;
    ``positions``: ``scalar`` (``position [1]``) or ``seed`` (``position_ids [1, processed + q]``; ``POSITIONS``).
    ``_planted`` is TEST-ONLY: it writes a deliberately wrong program (``PLANTED_BUGS``) so that
    tests can show certification rejects it; it is recorded in the metadata.
    """
    options = ExportOptions(
        layout=layout, gdn=gdn, last_token_only=bool(last_token_only), planted=_planted, positions=positions
    )
    mq = _check_sizes(target, k, max_query, options)
    out = Path(path)
    if out.suffix != ".mlpackage":
        raise InvalidSettingError(f"bundle export: {str(out)!r} must end in .mlpackage")
    ct = import_coremltools("Core ML export")
    t0 = time.perf_counter()
    prog = build_program(target, max_query=mq, options=options)
    cfg = target.config
    model = convert_program(prog, cfg, layout=layout, tokens=ct.RangeDim(1, mq, default=1), positions=positions)
    model.short_description = f"specproof export of {target.describe()}; verify forwards of up to {mq} tokens" + (
        "; LAST-TOKEN-ONLY logits (does not qualify for verify)" if last_token_only else ""
    )
    meta = export_metadata(target, target_spec=target_spec, options=options, max_query=mq)
    for key, value in meta.items():
        model.user_defined_metadata[f"specproof.{key}"] = value
    model.save(str(out))
    return ExportResult(
        path=out,
        target_spec=target_spec or "reference",
        config=cfg,
        max_query=mq,
        last_token_only=bool(last_token_only),
        layout=layout,
        gdn=meta["gdn"],
        bytes=_dir_bytes(out),
        seconds=time.perf_counter() - t0,
    )


def convert_program(prog: Any, cfg: ReferenceConfig, *, layout: str, tokens: Any, positions: str = "scalar") -> Any:
    """The ``MLModel`` (not loaded) of ``prog``; ``tokens`` the length of ``input_ids`` (an int or a ``RangeDim``),
    ``positions`` its position layout (``POSITIONS``)."""
    ct = import_coremltools("Core ML export")
    fixed = tokens if isinstance(tokens, int) else None
    io = [
        ct.TensorType(name=name, shape=shape, dtype=np.float16)
        for name, shape in state_shapes(cfg, layout=layout).items()
        if layout != "all-mlstate" and name not in ("key_cache", "value_cache", "kv_cache")
    ]
    return ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        # the program is already fp16 where it should be; FLOAT32 keeps the converter from re-casting it
        compute_precision=ct.precision.FLOAT32,
        inputs=[
            ct.TensorType(name="input_ids", shape=(1, tokens), dtype=np.int32),
            position_input_type(ct, positions=positions, fixed_query=fixed, max_context=cfg.max_context),
            *io,
        ],
        skip_model_load=True,
    )


def export_metadata(
    target: ReferenceHybrid, *, target_spec: str, options: ExportOptions, max_query: int
) -> dict[str, str]:
    """The ``specproof.*`` metadata of an export (keys without the prefix)."""
    cfg = target.config
    meta = {
        "target": target_spec or "reference",
        "max_context": str(cfg.max_context),
        "vocab_size": str(cfg.vocab_size),
        "max_query": str(max_query),
        "last_token_only": str(options.last_token_only).lower(),
        "layout": options.layout,
        "gdn": options.gdn if cfg.n_gdn_layers else "none",
        "ffn": f"moe-{cfg.n_experts}-top{cfg.experts_per_token}" if cfg.is_moe else "dense",
    }
    if options.positions != "scalar":  # bundles in the default layout keep their metadata as before
        meta["positions"] = options.positions
    if options.planted:
        meta["planted_bug"] = options.planted
    return meta


def golden_cases(
    target: Any, *, prompts: Sequence[Sequence[int]] = GOLDEN_PROMPTS, max_new_tokens: int = GOLDEN_MAX_NEW_TOKENS
) -> list[dict[str, Any]]:
    """Greedy continuations of ``prompts`` on ``target`` (the oracle), as golden-file cases."""
    from specproof.engine import greedy_decode

    cases = []
    for prompt in prompts:
        bad = [t for t in prompt if not 0 <= t < target.vocab_size]
        if bad:
            raise InvalidSettingError(
                f"golden prompt {list(prompt)[:8]}...: id {bad[0]} is outside [0, {target.vocab_size})"
            )
        gen = greedy_decode(target, list(prompt), max_new_tokens, eos_token_id=None)
        cases.append(
            {"prompt": list(prompt), "max_new_tokens": max_new_tokens, "eos_token_id": None, "tokens": list(gen.tokens)}
        )
    return cases


def write_golden(
    path: str | Path, target: Any, *, target_spec: str, cases: list[dict[str, Any]] | None = None, **options: Any
) -> dict[str, Any]:
    """Write a golden file (``specproof.formats.golden``) of greedy tokens on ``target`` (or the ``cases`` given)."""
    doc = {"format": GOLDEN_FORMAT, "target": target_spec, "cases": cases or golden_cases(target, **options)}
    # one case per line: diffs of a regenerated file show which prompt changed
    golden_format.FORMAT_ONE_CASE_PER_LINE.write(path, doc)
    return doc


def export_config(config: ReferenceConfig, *, max_context: int | None) -> ReferenceConfig:
    """``config`` with ``max_context`` replaced (the weights do not depend on it)."""
    return config if max_context is None else attrs.evolve(config, max_context=max_context)
