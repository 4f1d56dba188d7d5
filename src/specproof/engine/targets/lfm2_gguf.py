"""Write an LFM2-compatible reference model as a GGUF file llama.cpp loads as arch ``lfm2``.

Our own writer over the ``gguf`` package's ``GGUFWriter`` (PyPI ``gguf``, pure Python), not
llama.cpp's ``convert_hf_to_gguf.py``: the converter needs torch and a Hugging Face tokenizer
directory (the fixture has neither: it works on token ids), and it is only shipped inside
llama.cpp's source tree, not as an installable module. What the converter's ``LFM2Model`` does is
small and reproduced here from the same tables: tensor names come from ``gguf``'s own
``get_tensor_name_map(MODEL_ARCH.LFM2, ...)`` (the map the converter uses), the depthwise conv
weight ``[d, 1, L]`` is squeezed to ``[d, L]``, ``head_count_kv`` is a per-layer array (0 on the
conv layers: llama.cpp's marker of a recurrent layer) and the feed-forward width is
``block_ff_dim`` as is (``block_auto_adjust_ff_dim`` is off in ``lfm2_config``).

The vocabulary is the minimal one llama.cpp accepts: a SentencePiece-type (``llama``) list of
``vocab_size`` tokens, the first 256 the byte tokens ``<0x00>`` ... ``<0xFF>`` (llama.cpp's SPM
vocab looks up ``<0x0A>`` as its newline token), any others ``<tokN>``; scores 0. The fixture's
ids are its bytes, so text round-trips too, but specproof only ever passes token ids. llama.cpp's
SPM defaults (``bos`` 1, ``eos`` 2) stay: a GGUF cannot say "no EOS", and the ``llamacpp:``
engine never lets llama.cpp stop on one (it stops only on the ``eos_token_id`` it is asked for).

The target spec the file was exported from is stored as ``specproof.source`` (the ``llamacpp:``
engine's default oracle), and ``specproof.format`` = ``specproof-lfm2-gguf/1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from specproof.contract.errors import InvalidSettingError, MissingDependencyError
from specproof.engine.targets.convert import check_lfm2_compatible
from specproof.engine.targets.reference import ReferenceHybrid

__all__ = [
    "GGUF_FORMAT",
    "INSTALL_HINT",
    "gguf_tensors",
    "gguf_vocab",
    "read_gguf_metadata",
    "read_gguf_source",
    "require_gguf",
    "save_lfm2_gguf",
]

GGUF_FORMAT = "specproof-lfm2-gguf/1"
INSTALL_HINT = "pip install 'specproof[llamacpp]' (gguf and llama-cpp-python; docs/real-engines.md)"
_SOURCE_KEY = "specproof.source"
_FORMAT_KEY = "specproof.format"


def require_gguf() -> Any:
    """The ``gguf`` module, or ``MissingDependencyError`` naming the extra."""
    try:
        import gguf
    except ImportError as exc:
        raise MissingDependencyError(
            f"writing and reading GGUF needs the gguf package ({exc}): {INSTALL_HINT}"
        ) from exc
    return gguf


def _check(ref: object) -> ReferenceHybrid:
    if not isinstance(ref, ReferenceHybrid):
        raise InvalidSettingError(f"reference -> gguf lfm2: expected a ReferenceHybrid, got {type(ref).__name__}")
    check_lfm2_compatible(ref.config, framework="gguf")
    return ref


def gguf_tensors(ref: ReferenceHybrid) -> dict[str, npt.NDArray[np.float32]]:
    """``ref``'s weights under their GGUF names (``gguf``'s LFM2 tensor map), float32, in numpy layout.

    ``InvalidSettingError`` naming a tensor the map does not know (nothing is dropped silently).
    The tied output head is not written (llama.cpp reuses ``token_embd`` when ``output`` is absent).
    """
    gguf = require_gguf()
    ref = _check(ref)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LFM2, len(ref.config.layers))
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, value in ref.weights.items():
        if name == "lm_head.weight" and ref.config.tie_embeddings:
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise InvalidSettingError(f"reference -> gguf lfm2: tensor {name!r} has no GGUF name in gguf's LFM2 map")
        array = np.ascontiguousarray(value, dtype=np.float32)
        if name.endswith(".conv.conv.weight"):
            array = np.ascontiguousarray(array.squeeze(1))  # [d, 1, L] -> [d, L]: ggml's ssm_conv takes 2-D
        out[mapped] = array
    return out


def gguf_vocab(vocab_size: int) -> tuple[list[str], list[int]]:
    """The minimal SPM vocabulary: ``(tokens, token_types)`` (byte tokens first, then ``<tokN>``)."""
    gguf = require_gguf()
    tokens = [f"<0x{i:02X}>" if i < 256 else f"<tok{i}>" for i in range(vocab_size)]
    types = [int(gguf.TokenType.BYTE if i < 256 else gguf.TokenType.NORMAL) for i in range(vocab_size)]
    return tokens, types


def save_lfm2_gguf(ref: ReferenceHybrid, path: str | Path, *, source: str | None = None) -> Path:
    """Write ``ref`` as an ``lfm2`` GGUF file (float32 tensors); returns the file's path.

    ``path`` is the file, or an existing directory / a path without a ``.gguf`` suffix (a
    directory, created) to write ``model.gguf`` in. ``source`` (the target spec of ``ref``) is
    recorded as ``specproof.source``.
    """
    gguf = require_gguf()
    ref = _check(ref)
    cfg = ref.config
    target = Path(path)
    if target.suffix != ".gguf" or target.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        target = target / "model.gguf"
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
    tensors = gguf_tensors(ref)
    tokens, types = gguf_vocab(cfg.vocab_size)
    writer = gguf.GGUFWriter(str(target), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LFM2])
    try:
        writer.add_name(f"specproof {source or 'reference'}")
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        writer.add_context_length(cfg.max_context)
        writer.add_embedding_length(cfg.d_model)
        writer.add_block_count(len(cfg.layers))
        writer.add_feed_forward_length(cfg.ffn_dim)
        writer.add_head_count(cfg.n_heads)
        writer.add_head_count_kv([cfg.n_kv_heads if kind == "attn" else 0 for kind in cfg.layers])
        writer.add_rope_freq_base(float(cfg.rope_theta))
        writer.add_layer_norm_rms_eps(float(cfg.norm_eps))
        writer.add_shortconv_l_cache(cfg.conv_kernel)
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores([0.0] * cfg.vocab_size)
        writer.add_token_types(types)
        writer.add_add_bos_token(False)
        writer.add_add_eos_token(False)
        writer.add_string(_FORMAT_KEY, GGUF_FORMAT)
        if source is not None:
            writer.add_string(_SOURCE_KEY, source)
        for name, array in tensors.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return target


def _field_text(field: Any) -> str:
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def read_gguf_metadata(path: str | Path) -> Mapping[str, Any]:
    """The GGUF file's string and scalar metadata (arrays left out) read with ``gguf.GGUFReader``."""
    gguf = require_gguf()
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError, struct.error, IndexError ... on a damaged file
        raise InvalidSettingError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not field.types or field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        if field.types[0] == gguf.GGUFValueType.STRING:
            out[key] = _field_text(field)
        else:
            out[key] = field.parts[field.data[0]][0].item()
    return out


def read_gguf_source(path: str | Path) -> str | None:
    """The target spec ``specproof export gguf`` recorded in ``path`` (``specproof.source``), or None."""
    source = read_gguf_metadata(path).get(_SOURCE_KEY)
    return source if isinstance(source, str) and source else None
