"""transformers' own prompt-lookup decoding, certified as a black-box engine against plain greedy.

On transformers 5.x, ``generate(prompt_lookup_num_tokens=k)`` on the tiny LFM2 equals plain greedy
token for token (its cache now records past conv states and crops them on rejection). On the
stateful Qwen3.5 transformers refuses assisted generation outright; the test pins that too, so a
release that starts accepting it gets certified here before anyone relies on it.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the hf extra: pip install 'specproof[hf]'")
pytest.importorskip("transformers", reason="needs the hf extra: pip install 'specproof[hf]'")

from specproof.engine import Engine, InvalidSettingError, TokenRangeError, greedy_with_margins  # noqa: E402
from specproof.engine.adapters.hf_prompt_lookup import HFPromptLookupEngine, make  # noqa: E402
from specproof.engine.targets.hf import HFTarget, load_spec  # noqa: E402
from specproof.plugins import resolve_plugin  # noqa: E402

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

torch.set_num_threads(1)  # tiny models on shared cores

PROMPTS = [
    list(b"the cat sat on the mat. the cat sat on the mat. the cat"),
    list(b"abcabcabcabcabc"),
    list(b"hello"),
    [int(x) for x in np.random.default_rng(3).integers(0, 256, 12)],
]


@pytest.fixture(scope="module")
def engine() -> HFPromptLookupEngine:
    return make()


def test_is_a_pluggable_black_box_engine(engine: HFPromptLookupEngine) -> None:
    plugged = resolve_plugin("specproof.engine.adapters.hf_prompt_lookup:make", kind="engine")
    assert isinstance(plugged, HFPromptLookupEngine) and isinstance(plugged, Engine)
    assert isinstance(engine.oracle, HFTarget) and engine.oracle.model is engine.model
    assert engine.vocab_size == 256
    gen = engine.generate(PROMPTS[0], 5)
    assert gen.steps is None and len(gen.tokens) == 5 and gen.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["repetitive", "abc", "hello", "random"])
def test_prompt_lookup_equals_greedy_on_lfm2(engine: HFPromptLookupEngine, prompt: list[int], k: int) -> None:
    eng = HFPromptLookupEngine(engine.oracle, prompt_lookup_num_tokens=k)
    greedy, margins = greedy_with_margins(eng.oracle, prompt, 40)
    got = eng.generate(prompt, 40).tokens
    div = next((i for i, (a, b) in enumerate(zip(greedy.tokens, got)) if a != b), None)
    assert div is None and len(got) == 40, (
        f"diverges at {div}, top-2 margin {margins[div] if div is not None else None}"
    )


def test_eos_and_errors(engine: HFPromptLookupEngine) -> None:
    greedy = greedy_with_margins(engine.oracle, PROMPTS[0], 20)[0].tokens
    eos = greedy[6]
    gen = engine.generate(PROMPTS[0], 20, eos_token_id=eos)
    assert gen.stop_reason == "eos" and gen.tokens == greedy[: greedy.index(eos) + 1]
    assert engine.generate(PROMPTS[0], 0).tokens == ()
    with pytest.raises(TokenRangeError):
        engine.generate([1, 999], 3)
    with pytest.raises(TokenRangeError):
        engine.generate([1, 2], 3, eos_token_id=256)
    with pytest.raises(InvalidSettingError):
        HFPromptLookupEngine(engine.oracle, prompt_lookup_num_tokens=0)


def test_transformers_refuses_prompt_lookup_on_qwen3_5() -> None:
    target = load_spec("qwen3_5-tiny")
    eng = HFPromptLookupEngine(target)
    with pytest.raises(ValueError, match="not supported with stateful models"):
        eng.generate(PROMPTS[0], 8)
