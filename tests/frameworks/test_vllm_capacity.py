"""The ``vllm:`` engine's context capacity agrees with its oracle's, without vLLM.

``engine.lossless`` compares an engine with plain greedy decoding in the oracle's context. The adapter
used to default ``max_model_len`` to 1024 (capacity 1023) against the fixture's 4096: near the end of
vLLM's context it stopped full where greedy ran on, and the comparison failed on a prompt the ci search
draws rarely (reported as "nondeterministic", docs/real-engines.md). These tests drive ``VLLMEngine``
over a stand-in ``vllm`` module that enforces vLLM's own length rules (``len(prompt) + max_tokens <=
max_model_len``; ``max_model_len <= max_position_embeddings`` unless ``hf_overrides`` raises it) and
decodes greedily on the reference, so they run anywhere; tests/frameworks/test_vllm_engine.py holds
the real vLLM to the same at the ci profile.
"""

from __future__ import annotations

import copy
import enum
import json
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from specproof.contract.lossless import compare_lossless
from specproof.engine import InvalidSettingError, greedy_decode
from specproof.engine.adapters import vllm as adapter
from specproof.engine.targets.convert import save_vllm_lfm2
from specproof.fixtures import load_trained_target
from specproof.plugins import load_target


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vllm_lfm2(load_trained_target(), str(tmp_path_factory.mktemp("vllm") / "trained"), source="trained")


@attrs.define
class FakeLLM:
    """``vllm.LLM`` as far as the adapter uses it: vLLM's length checks, greedy decoding on ``model``."""

    model: Any
    built: list[dict[str, Any]]
    kwargs: dict[str, Any]

    def __attrs_post_init__(self) -> None:
        config = json.loads((Path(self.kwargs["model"]) / "config.json").read_text())
        positions = (self.kwargs.get("hf_overrides") or {}).get(
            "max_position_embeddings", config["max_position_embeddings"]
        )
        if self.kwargs["max_model_len"] > positions:  # vLLM's ModelConfig refuses it the same way
            raise ValueError(f"max_model_len {self.kwargs['max_model_len']} > max_position_embeddings {positions}")
        self.built.append(self.kwargs)

    def generate(self, prompts: Sequence[dict[str, Any]], params: Any, use_tqdm: bool = False) -> list[Any]:
        outs = []
        for prompt, each in zip(prompts, params if isinstance(params, list) else [params] * len(prompts)):
            ids = prompt["prompt_token_ids"]
            if len(ids) + each.max_tokens > self.kwargs["max_model_len"]:
                raise ValueError(f"prompt {len(ids)} + max_tokens {each.max_tokens} > max_model_len")
            ref = copy.deepcopy(self.model)
            ref.reset()
            tokens = greedy_decode(ref, ids, each.max_tokens).tokens
            completion = types.SimpleNamespace(token_ids=list(tokens), spec_decode_metrics=None)
            outs.append(types.SimpleNamespace(outputs=[completion]))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """A stand-in ``vllm`` module; yields the keyword arguments of every ``LLM`` it built."""
    built: list[dict[str, Any]] = []
    module = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    module.inputs = inputs  # type: ignore[attr-defined]
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = enum.Enum("RequestOutputKind", "CUMULATIVE DELTA FINAL_ONLY")  # type: ignore[attr-defined]
    module.sampling_params = sampling  # type: ignore[attr-defined]
    module.SamplingParams = types.SimpleNamespace  # type: ignore[attr-defined]
    reference = load_trained_target()
    module.LLM = lambda **kwargs: FakeLLM(reference, built, kwargs)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    monkeypatch.setattr(adapter, "_LLM", {})
    yield built


def test_the_default_capacity_is_the_oracles(checkpoint: Path, fake_vllm: list[dict[str, Any]]) -> None:
    oracle = load_target("trained")
    engine = adapter.VLLMEngine(adapter.parse_vllm_spec(str(checkpoint)), oracle=oracle)
    assert engine.max_context == oracle.max_context == 4096
    (kwargs,) = fake_vllm
    # vLLM counts the last, never-fed-back token: one more than the positions the model holds; the
    # checkpoint's max_position_embeddings (4096, the fixture's max_context) is raised to allow it
    assert kwargs["max_model_len"] == 4097
    assert kwargs["hf_overrides"] == {"max_position_embeddings": 4097}
    assert "max_model_len=4097" in engine.name
    assert engine.speculative is False  # plain greedy says so: a PASS, not INCONCLUSIVE


def test_a_smaller_oracle_needs_no_override(checkpoint: Path, fake_vllm: list[dict[str, Any]]) -> None:
    engine = adapter.VLLMEngine(adapter.parse_vllm_spec(str(checkpoint)), oracle=load_target("trained:max_context=48"))
    (kwargs,) = fake_vllm
    assert engine.max_context == 48 and kwargs["max_model_len"] == 49 and "hf_overrides" not in kwargs


def test_near_the_end_of_the_context_the_engine_stops_where_greedy_does(
    checkpoint: Path, fake_vllm: list[dict[str, Any]]
) -> None:
    oracle = load_target("trained:max_context=48")
    engine = adapter.VLLMEngine(adapter.parse_vllm_spec(str(checkpoint)), oracle=oracle)
    for room in (0, 1, 3, 9):
        prompt = [(7 * i + 3) % 251 for i in range(engine.max_context - room)]
        gen = engine.generate(prompt, 10)
        ref = copy.deepcopy(oracle)
        ref.reset()
        expected = greedy_decode(ref, prompt, 10)
        assert gen.stop_reason == expected.stop_reason == ("context_full" if room < 9 else "max_new_tokens")
        # as the suite compares (engine.lossless: no stop reasons): equal tokens, equal length
        assert compare_lossless(list(gen.tokens), list(expected.tokens)).status == "pass", room


def test_the_old_default_is_what_failed(checkpoint: Path, fake_vllm: list[dict[str, Any]]) -> None:
    """The meta-test: an engine with a smaller context than its oracle (the old default, max_model_len
    = 1024 against 4096, here 49 against 64) fails the suite's comparison near its end; the adapter now
    refuses that pairing before vLLM starts, naming both ways out."""
    small = load_target("trained:max_context=48")
    engine = adapter.VLLMEngine(adapter.parse_vllm_spec(f"{checkpoint},max_model_len=49"), oracle=small)
    prompt = [(7 * i + 3) % 251 for i in range(engine.max_context - 3)]
    gen = engine.generate(prompt, 10)
    assert gen.stop_reason == "context_full" and len(gen.tokens) == 4
    bigger = load_target("trained:max_context=64")
    expected = greedy_decode(bigger, prompt, 10)
    assert len(expected.tokens) == 10  # greedy in the bigger context runs on ...
    verdict = compare_lossless(list(gen.tokens), list(expected.tokens))
    assert verdict.status == "fail" and "stopped after 4 tokens" in verdict.explanation  # ... and the run fails
    with pytest.raises(InvalidSettingError, match=r"would hold 48 tokens but its oracle holds 64.*max_context=48"):
        adapter.VLLMEngine(adapter.parse_vllm_spec(f"{checkpoint},max_model_len=49"), oracle=bigger)
    assert len(fake_vllm) == 1  # refused before a second LLM was built


def test_an_oracle_without_a_capacity_is_refused(checkpoint: Path, fake_vllm: list[dict[str, Any]]) -> None:
    oracle = load_target("trained")
    shapeless = types.SimpleNamespace(vocab_size=oracle.vocab_size, max_context=None)
    with pytest.raises(InvalidSettingError, match="oracle states no max_context"):
        adapter.VLLMEngine(adapter.parse_vllm_spec(str(checkpoint)), oracle=shapeless)
    assert fake_vllm == []


def test_sampling_maps_onto_vllms_parameters(checkpoint: Path, fake_vllm: list[dict[str, Any]]) -> None:
    from specproof.contract import SamplingParams
    from specproof.engine.adapters.vllm import _sampling_kwargs

    assert _sampling_kwargs(None) == {"temperature": 0.0}
    assert _sampling_kwargs(SamplingParams(temperature=0.8, top_k=1, seed=3)) == {"temperature": 0.0}  # greedy
    assert _sampling_kwargs(SamplingParams(temperature=0.8, top_p=0.95, seed=7)) == {
        "temperature": 0.8, "top_k": 0, "top_p": 0.95, "min_p": 0.0, "seed": 7,
    }  # fmt: skip
    engine = adapter.VLLMEngine(adapter.parse_vllm_spec(str(checkpoint)), oracle=load_target("trained:max_context=48"))
    assert {"sampling", "seeded"} <= engine.capabilities
    with pytest.raises(InvalidSettingError, match="sampling must be SamplingParams"):
        engine.generate([1, 2], 3, sampling={"temperature": 0.8})  # type: ignore[arg-type]
