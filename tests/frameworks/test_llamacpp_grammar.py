"""llama.cpp's grammar sampler on the request's grammar, held to ``decode.grammar`` on the trained fixture
(docs/real-engines.md, "Grammars on llama.cpp").

The translations (``_llamacpp_grammar``) allow what llguidance allows: along random walks through each of the
grammar check's grammars, with and without a reasoning delimiter, llama.cpp's grammar sampler and the oracle's
llguidance matcher allow the same tokens at every step. ``decode.grammar`` passes at quick with ``eos=0`` (the
grammar requests' EOS as llama.cpp's end of generation), plain and with prompt lookup, whose drafts are accepted
under the grammar; the grammar dropped from the chain (the grammar silently ignored) fails at quick, and the
grammar placed first in the chain (masking commutes with the penalties and the bias) passes.

Skipped when llama-cpp-python is not importable; run in the llama.cpp environment (``tox -e llamacpp``).
"""

from __future__ import annotations

import ctypes
import random
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

try:
    import llama_cpp
except ImportError as exc:
    pytest.skip(f"llama-cpp-python is not importable here ({exc}); run tox -e llamacpp", allow_module_level=True)

from specproof.conformance.checks.decode_grammar import grammars
from specproof.contract import DecodeParams
from specproof.contract.decode_state import OracleGrammar, plain_decode_with
from specproof.contract.errors import UnsupportedParameterError
from specproof.engine.adapters._llamacpp_grammar import grammar_stage, translate_grammar
from specproof.engine.targets.lfm2_gguf import save_lfm2_gguf
from specproof.fixtures import load_trained_target
from specproof.plugins import resolve_plugin

pytestmark = pytest.mark.slow

LOOKUP = "speculative=lookup:4,n_rs_seq=4"
DELIMITER = tuple(b"</t>")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_lfm2_gguf(load_trained_target(), tmp_path_factory.mktemp("gguf") / "trained.gguf", source="trained")


class _Chain:
    """What ``grammar_stage``'s stage adds to: a bare llama.cpp sampler chain."""

    def __init__(self, low: Any) -> None:
        self.low = low
        self.sampler = low.llama_sampler_chain_init(low.llama_sampler_chain_default_params())

    def allowed(self, n: int) -> np.ndarray:
        low = self.low
        cells = (low.llama_token_data * n)(*[low.llama_token_data(i, 0.0, 0.0) for i in range(n)])
        low.llama_sampler_apply(self.sampler, ctypes.byref(low.llama_token_data_array(cells, n, -1, False)))
        return np.array([np.isfinite(cells[i].logit) for i in range(n)])


@pytest.mark.parametrize("delimiter", [(), DELIMITER], ids=["constrained", "reasoning"])
@pytest.mark.parametrize("index", range(len(grammars())), ids=["json-object", "json-array", "regex", "lark"])
def test_llama_cpps_masks_equal_llguidances_along_random_walks(model: Path, index: int, delimiter: tuple) -> None:
    low = llama_cpp.llama_cpp
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=256, kv_overrides={"tokenizer.ggml.eos_token_id": 0},
                          verbose=False)  # fmt: skip
    grammar, rng, compared = attrs.evolve(grammars()[index], reasoning_end=delimiter), random.Random(index), 0
    for _walk in range(15):
        chain, oracle = _Chain(low), OracleGrammar(grammar, frozenset({0}), 256)
        grammar_stage(low, llm._model.vocab, translate_grammar(grammar, 256))(chain)
        free = [rng.randrange(32, 127) for _ in range(rng.randrange(4))] + list(delimiter)
        for step in range(30):
            if oracle.free is not None:  # free text: llama.cpp's lazy grammar masks nothing yet
                token = free[step]
            else:
                want, got = oracle.allowed(), chain.allowed(256)
                assert want is not None and (got == want).all(), (step, np.flatnonzero(got ^ want))
                compared += 1
                token = int(rng.choice(np.flatnonzero(want)))
            if token == 0:
                break
            low.llama_sampler_accept(chain.sampler, token)
            oracle.feed(token)
        low.llama_sampler_free(chain.sampler)
    llm.close()
    assert compared >= 15


@pytest.mark.parametrize("options", ["eos=0", f"{LOOKUP},eos=0"])
def test_decode_grammar_passes_at_quick(model: Path, options: str) -> None:
    from specproof.conformance import certify

    report = certify("engine", engine=f"llamacpp:{model},{options}", only=("decode.grammar",), decode_state=True)
    [result] = report.to_json()["results"]
    assert result["status"] == "pass" and result["exercised"] > 0, result


def _certify_lookup_grammar(model: Path) -> dict[str, Any]:
    from specproof.conformance import certify

    report = certify("engine", engine=f"llamacpp:{model},{LOOKUP},eos=0", only=("decode.grammar",), decode_state=True)
    [result] = report.to_json()["results"]
    return result


def test_a_grammar_dropped_from_the_chain_is_rejected(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The meta-test: the grammar translated, the request accepted, but no grammar sampler in the chain (the
    grammar silently ignored) fails ``decode.grammar`` at quick with prompt lookup on."""
    from specproof.engine.adapters import llamacpp as adapter

    monkeypatch.setattr(adapter, "grammar_stage", lambda *args: lambda chain: None)
    result = _certify_lookup_grammar(model)
    assert result["status"] == "fail", result
    assert "not allowed there by the" in result["violations"][0]["explanation"]


def test_the_grammar_first_in_the_chain_is_accepted(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Correct but different: the grammar sampler before the penalties and the bias (a mask commutes with them;
    the logprobs are still read after it) passes at quick."""
    from specproof.engine.adapters import llamacpp as adapter

    build = adapter.build_decode_chain

    class _GrammarFirst:
        def __init__(self, internals: Any, grammar: Any) -> None:
            self.internals, self.grammar = internals, grammar

        def LlamaSampler(self) -> Any:  # llama-cpp-python's name
            chain = self.internals.LlamaSampler()
            self.grammar(chain)
            return chain

    def grammar_first(internals: Any, *, grammar: Any = None, **kwargs: Any) -> Any:
        return build(_GrammarFirst(internals, grammar) if grammar else internals, **kwargs)

    monkeypatch.setattr(adapter, "build_decode_chain", grammar_first)
    result = _certify_lookup_grammar(model)
    assert result["status"] == "pass" and result["exercised"] > 0, result


def test_prompt_lookup_drafts_under_a_grammar(model: Path) -> None:
    """The pass is speculative: on prompts that repeat themselves, drafts are made and accepted under each
    grammar (across the reasoning delimiter too) and every output equals plain decoding's."""
    engine: Any = resolve_plugin(f"llamacpp:{model},{LOOKUP},eos=0", kind="engine")
    prompts = [list(b"12,345,6 12,345,6 12,3"), list(b'{"a":42} {"a":42} {"a":4'), list(b"7,77,777 7,77,7")]
    drafted = accepted = 0
    for prompt in prompts:
        for grammar in grammars():
            for delimiter in [(), (32,)]:
                params = DecodeParams(grammar=attrs.evolve(grammar, reasoning_end=delimiter), eos_token_ids=[0])
                gen = engine.generate(prompt, 16, decode=params)
                assert list(gen.tokens) == list(plain_decode_with(engine.oracle, prompt, 16, decode=params).tokens)
                drafted, accepted = drafted + gen.stats.drafted, accepted + gen.stats.accepted
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    engine.close()


def test_a_grammar_request_on_another_eos_is_refused_naming_the_option(model: Path) -> None:
    engine: Any = resolve_plugin(f"llamacpp:{model}", kind="engine")  # the GGUF's EOS: 2
    with pytest.raises(UnsupportedParameterError, match=r"end-of-generation ids \[2\]; give the engine eos=0"):
        engine.generate([1, 2, 3], 4, decode=DecodeParams(grammar=grammars()[2], eos_token_ids=[0]))
    engine.close()
