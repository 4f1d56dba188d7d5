"""``specproof export``: write a fixture in the shape a real engine loads.

``specproof export vllm OUT_DIR [--target trained] [--head-dim N]`` writes an LFM2 checkpoint
directory (``config.json`` + ``model.safetensors``) that vLLM's CPU backend loads: ``conv_dim``
set and the heads padded to a size vLLM supports by an exact re-embedding
(``specproof.engine.targets.convert.pad_lfm2_heads``). docs/real-engines.md.
"""

from __future__ import annotations

import argparse

from specproof.contract import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "export",
        help="write a fixture as a checkpoint a real engine loads (vllm)",
        description="Write a reference-family target (default the trained fixture) in the shape a real engine loads.",
    )
    p.add_argument("format", choices=("vllm",), help="vllm: a Hugging Face LFM2 directory vLLM's CPU backend loads")
    p.add_argument("out", metavar="OUT_DIR", help="the directory to write (created; files in it are replaced)")
    p.add_argument("--target", default="trained", help="the target spec to export (default: trained)")
    p.add_argument(
        "--head-dim",
        type=int,
        default=None,
        metavar="N",
        help="pad the attention heads to N (default: the smallest head size vLLM's CPU backend supports)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specproof.engine import ReferenceHybrid
    from specproof.engine.targets.convert import save_vllm_lfm2
    from specproof.plugins import load_target

    target = load_target(args.target)
    if not isinstance(target, ReferenceHybrid):
        raise UsageError(
            f"--target {args.target!r} is a {type(target).__name__}; only reference-family targets can be exported"
        )
    out = save_vllm_lfm2(target, args.out, source=args.target, head_dim=args.head_dim)
    import json

    padded = json.loads((out / "config.json").read_text())["head_dim"]
    print(f"wrote {out}/config.json and model.safetensors: {args.target}, heads {target.config.head_dim} -> {padded}")
    return 0
