"""The ``vllm:`` engine's grammar mapping without vLLM: the export's byte tokenizer, the ``structured=`` option,
each grammar kind as ``StructuredOutputsParams`` keywords and the refusals that name why (docs/real-engines.md,
"vLLM grammars"). tests/frameworks/test_vllm_decode.py certifies them on a real vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from specproof.conformance.checks.decode_grammar import grammars
from specproof.contract import DecodeParams
from specproof.contract.errors import InvalidSettingError, UnsupportedParameterError
from specproof.engine.adapters._vllm_decode import structured_outputs, vllm_decode
from specproof.engine.adapters.vllm import VLLMSettings, _structured_eos, parse_vllm_spec
from specproof.engine.targets._byte_tokenizer import read_tokenizer_eos, write_byte_tokenizer
from specproof.engine.targets.convert import save_vllm_lfm2
from specproof.fixtures import load_trained_target

JSON_OBJECT, JSON_ARRAY, REGEX, LARK = grammars()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vllm_lfm2(load_trained_target(), str(tmp_path_factory.mktemp("vllm") / "trained"), source="trained")


def test_the_export_writes_the_byte_tokenizer_with_eos_0(checkpoint: Path) -> None:
    vocab = json.loads((checkpoint / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocab == {f"<0x{i:02X}>": i for i in range(256)}
    assert read_tokenizer_eos(checkpoint) == 0


def test_the_byte_tokenizer_reads_back_its_eos(tmp_path: Path) -> None:
    assert read_tokenizer_eos(tmp_path) is None  # no tokenizer
    write_byte_tokenizer(tmp_path, eos_id=7)
    assert read_tokenizer_eos(tmp_path) == 7
    with pytest.raises(ValueError, match="not a byte id"):
        write_byte_tokenizer(tmp_path, eos_id=256)


def test_the_byte_tokenizer_encodes_each_byte_as_its_id(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers", reason="the Hugging Face tokenizers package reads it")
    write_byte_tokenizer(tmp_path, eos_id=0)
    tokenizer = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.encode('{"a":9}\xff'.encode("latin-1").decode("latin-1")).ids[:7] == list(b'{"a":9}')
    assert tokenizer.decode(list(b"12,3"), skip_special_tokens=False) == "12,3"


def test_structured_guidance_is_an_option_that_loads_the_tokenizer(checkpoint: Path) -> None:
    settings = parse_vllm_spec(f"{checkpoint},structured=guidance")
    assert settings.structured == "guidance"
    assert settings.short_name() == "vllm-greedy-guidance"
    assert ",structured=guidance" in settings.describe()
    kwargs = attrs.evolve(settings, max_model_len=4097).llm_kwargs()
    assert kwargs["skip_tokenizer_init"] is False
    assert kwargs["structured_outputs_config"] == {"backend": "guidance"}
    plain = attrs.evolve(parse_vllm_spec(str(checkpoint)), max_model_len=4097).llm_kwargs()
    assert plain["skip_tokenizer_init"] is True and "structured_outputs_config" not in plain
    assert _structured_eos(settings) == 0
    assert _structured_eos(parse_vllm_spec(str(checkpoint))) is None


@pytest.mark.parametrize("value", ["xgrammar", "1", "yes"])
def test_a_bad_structured_option_is_a_one_line_error(checkpoint: Path, value: str) -> None:
    with pytest.raises(InvalidSettingError, match=f"structured={value!r}: expected none or guidance"):
        parse_vllm_spec(f"{checkpoint},structured={value}")


def test_structured_outputs_without_a_tokenizer_are_refused_naming_the_export(tmp_path: Path) -> None:
    settings = VLLMSettings(model_dir=str(tmp_path), structured="guidance")  # a checkpoint written before
    with pytest.raises(InvalidSettingError, match=r"no tokenizer with an EOS.*specproof export vllm DIR"):
        _structured_eos(settings)


@pytest.mark.parametrize(
    ("grammar", "keywords"),
    [
        (JSON_ARRAY, {"json": json.loads(JSON_ARRAY.source)}),
        (REGEX, {"regex": REGEX.source}),
        (LARK, {"grammar": LARK.source}),
    ],
)
def test_each_kind_goes_to_vllm_as_it_is(grammar: object, keywords: dict[str, object]) -> None:
    decode = DecodeParams(grammar=grammar, eos_token_ids=[0])
    assert structured_outputs(decode, eos_ids=frozenset({0}), grammar_eos=0) == keywords
    assert vllm_decode(decode, eos_token_id=None, max_tokens=8, grammar_eos=0).structured == keywords


@pytest.mark.parametrize(
    ("decode", "grammar_eos", "message"),
    [
        (DecodeParams(grammar=REGEX, eos_token_ids=[0]), None, "need a tokenizer.*structured=guidance"),
        (DecodeParams(grammar=attrs.evolve(REGEX, reasoning_end=(60,)), eos_token_ids=[0]), 0, "reasoning parser"),
        (DecodeParams(grammar=REGEX, eos_token_ids=[5]), 0, r"EOS ids \[5\].*tokenizer's EOS id 0"),
        (DecodeParams(grammar=REGEX, eos_token_ids=[0, 5]), 0, r"EOS ids \[0, 5\]"),
    ],
)
def test_what_vllm_cannot_honour_is_refused_by_name(
    decode: DecodeParams, grammar_eos: int | None, message: str
) -> None:
    with pytest.raises(UnsupportedParameterError, match=message):
        vllm_decode(decode, eos_token_id=None, max_tokens=8, grammar_eos=grammar_eos)
