"""``specproof export``: write a fixture in the shape a real engine loads.

- ``specproof export vllm OUT_DIR [--target trained] [--head-dim N]`` writes an LFM2 checkpoint
  directory (``config.json`` + ``model.safetensors``) that vLLM's CPU backend loads: ``conv_dim``
  set and the heads padded to a size vLLM supports by an exact re-embedding
  (``specproof.engine.targets.convert.pad_lfm2_heads``);
- ``specproof export gguf OUT [--target trained]`` writes an ``lfm2`` GGUF file llama.cpp loads
  (``specproof.engine.targets.lfm2_gguf.save_lfm2_gguf``): ``OUT`` is the ``.gguf`` file, or a
  directory to write ``model.gguf`` in; needs the ``gguf`` package (``specproof[llamacpp]``).

docs/real-engines.md.
"""

from __future__ import annotations

import argparse

from specproof.contract import UsageError
from specproof.contract.validation import integer_argument


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "export",
        help="write a fixture as a checkpoint a real engine loads (vllm, gguf)",
        description="Write a reference-family target (default the trained fixture) in the shape a real engine loads.",
    )
    p.add_argument(
        "format",
        choices=("vllm", "gguf"),
        help="vllm: a Hugging Face LFM2 directory vLLM's CPU backend loads; gguf: an lfm2 GGUF file llama.cpp loads",
    )
    p.add_argument(
        "out",
        metavar="OUT",
        help="vllm: the directory to write (created; files in it are replaced); gguf: a .gguf file, or a "
        "directory to write model.gguf in",
    )
    p.add_argument("--target", default="trained", help="the target spec to export (default: trained)")
    p.add_argument(
        "--head-dim",
        type=integer_argument,
        default=None,
        metavar="N",
        help="vllm only: pad the attention heads to N (default: the smallest head size vLLM's CPU backend supports)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specproof.engine import ReferenceHybrid
    from specproof.plugins import load_target

    if args.format == "gguf" and args.head_dim is not None:
        raise UsageError("--head-dim applies to `export vllm` only: llama.cpp runs any head size")
    if args.format == "gguf":
        from specproof.engine.targets.lfm2_gguf import require_gguf

        require_gguf()  # before loading anything: a missing package is the first thing to say
    target = load_target(args.target)
    if not isinstance(target, ReferenceHybrid):
        raise UsageError(
            f"--target {args.target!r} is a {type(target).__name__}; only reference-family targets can be exported"
        )
    if args.format == "gguf":
        from specproof.engine.targets.lfm2_gguf import save_lfm2_gguf

        path = save_lfm2_gguf(target, args.out, source=args.target)
        print(f"wrote {path}: {args.target} as lfm2 GGUF (float32, {len(target.config.layers)} blocks)")
        return 0
    from specproof.engine.targets.convert import save_vllm_lfm2

    out = save_vllm_lfm2(target, args.out, source=args.target, head_dim=args.head_dim)
    import json

    padded = json.loads((out / "config.json").read_text())["head_dim"]
    tokenizer = " and the byte tokenizer" if (out / "tokenizer.json").is_file() else ""
    heads = f"heads {target.config.head_dim} -> {padded}"
    print(f"wrote {out}/config.json, model.safetensors{tokenizer}: {args.target}, {heads}")
    return 0
