"""Helpers shared by subcommands: building targets and drafters, tokenising prompts."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from specproof.contract.errors import InvalidSettingError, PluginError
from specproof.contract.validation import decimal_int
from specproof.engine import Target
from specproof.plugins import load_target

__all__ = ["add_target_argument", "decode_tokens", "encode_prompt", "make_target", "parse_ids"]

DEFAULT_TARGET = "reference"


def add_target_argument(parser: argparse.ArgumentParser, *, default: str = DEFAULT_TARGET) -> None:
    parser.add_argument(
        "--target",
        default=default,
        metavar="SPEC",
        help=(
            "target spec: reference, reference-moe, reference:FIELD=VALUE,..., mlx:..., hf:..., coreml:PATH, "
            f"or MODULE:ATTR (default {default})"
        ),
    )


def make_target(spec: str, *, seed: int | None = None) -> Target:
    """Build a target; ``seed`` re-seeds the weights of the reference family."""
    if seed is not None and spec.split(":", 1)[0] in ("reference", "reference-moe"):
        head, _, rest = spec.partition(":")
        spec = f"{head}:{rest + ',' if rest else ''}seed={seed}"
    return load_target(spec)


def parse_ids(text: str) -> list[int]:
    try:  # (strict: "1_0" is no token 10)
        return [decimal_int(part) for part in text.replace(",", " ").split()]
    except InvalidSettingError:
        raise PluginError(f"--ids {text!r}: expected decimal integers separated by commas or spaces") from None


def encode_prompt(target: Target, text: str) -> list[int]:
    """Tokenise with the target's own ``encode`` if it has one, else as UTF-8 bytes."""
    encode = getattr(target, "encode", None)
    if callable(encode):
        return list(encode(text))
    if target.vocab_size < 256:
        raise PluginError(
            f"target vocab_size={target.vocab_size} is not byte-level and has no encode(); pass token ids with --ids"
        )
    return list(text.encode("utf-8"))


def decode_tokens(target: Target, tokens: Sequence[int]) -> str:
    decode = getattr(target, "decode", None)
    if callable(decode):
        return str(decode(list(tokens)))
    if target.vocab_size <= 256 or all(t < 256 for t in tokens):
        return bytes(t for t in tokens if t < 256).decode("utf-8", errors="backslashreplace")
    return " ".join(str(t) for t in tokens)
