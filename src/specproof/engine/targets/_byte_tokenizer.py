"""The byte fixtures' vocabulary as a Hugging Face fast tokenizer: ``tokenizer.json`` and
``tokenizer_config.json`` beside an exported checkpoint (docs/real-engines.md, "vLLM grammars").

Id ``i`` is the byte ``i`` (``contract.token_bytes``), written as the byte-fallback token ``<0xII>`` of a BPE
model without merges, so a library that reads token bytes from the tokenizer (llguidance's ``from_tokenizer``,
which vLLM's structured outputs use) sees the contract's byte map. ``eos_id`` is the tokenizer's EOS, a special
token: it stands for no text, as the grammar requests' EOS does in the contract. Plain JSON: no ``tokenizers``
package is needed to write it.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["BYTE_VOCAB", "read_tokenizer_eos", "write_byte_tokenizer"]

BYTE_VOCAB = 256


def _piece(i: int) -> str:
    return f"<0x{i:02X}>"


def write_byte_tokenizer(out_dir: Path, *, eos_id: int = 0) -> None:
    """Write the 256-id byte tokenizer into ``out_dir`` with ``eos_id`` its (special) EOS."""
    if not 0 <= eos_id < BYTE_VOCAB:
        raise ValueError(f"eos_id={eos_id} is not a byte id")
    eos = _piece(eos_id)
    added = {"id": eos_id, "content": eos, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}  # fmt: skip
    sequence = {"Sequence": {"id": "A", "type_id": 0}}
    tokenizer: dict[str, object] = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [added], "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": [sequence],
                           "pair": [sequence, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {}},
        "decoder": {"type": "ByteFallback"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {_piece(i): i for i in range(BYTE_VOCAB)}, "merges": []},
    }  # fmt: skip
    config = {"eos_token": eos, "model_max_length": 1 << 30, "tokenizer_class": "PreTrainedTokenizerFast"}
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1) + "\n")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def read_tokenizer_eos(model_dir: Path) -> int | None:
    """The EOS id of the tokenizer in ``model_dir`` (None: no tokenizer there, or it names no EOS in its vocab)."""
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        vocab = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    eos = config.get("eos_token") if isinstance(config, dict) else None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    value = vocab.get(eos) if isinstance(vocab, dict) and isinstance(eos, str) else None
    return value if isinstance(value, int) else None
