"""Target-protocol tests shared by the framework targets (``MLXTarget``, ``HFTarget``).

``test_mlx_target.py`` and ``test_hf_target.py`` star-import this module (tests and fixtures),
so pytest collects the tests there, under each module's two fixtures:

- ``family``: the spec family (``"mlx"``, ``"hf"``); the fixtures here register it for the
  module and give the matching LFM2 converter (``save_lfm2``);
- ``proto``: one loaded tiny model per built-in config (module-scoped, parametrized by the
  family's ``TINY_MODELS``); ``target`` here is a fresh copy of it.

What differs between the frameworks (their own greedy generation, how a snapshot keeps the
state, whether a cropped KV can be restored) stays in the two modules.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from specproof.engine import (
    CapacityError,
    InvalidSettingError,
    NgramDrafter,
    PluginError,
    SpecDecoder,
    TokenRangeError,
    greedy_decode,
    register_target_family,
)
from specproof.engine.targets import TARGET_FAMILIES, convert
from specproof.engine.targets.convert import tiny_lfm2_reference
from specproof.plugins import load_target

__all__ = [
    "REPETITIVE",
    "_registered_family",
    "save_lfm2",
    "target",
    "test_capacity_and_token_range_change_nothing",
    "test_chunk_invariance_within_tolerance",
    "test_encode_decode_and_describe",
    "test_local_path_loads_offline",
    "test_checkpoint_rollback_only_where_the_state_allows_it",
    "test_oracle_drafts_all_and_partial_acceptance",
    "test_processed_and_restore_to_zero",
    "test_seed_override_changes_the_model",
    "test_spec_decoder_replay_is_lossless",
    "test_spec_errors_are_clear",
]

REPETITIVE = list(b"the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the")

# family -> the converter that writes a reference LFM2 model as that framework's model directory
_SAVERS = {"mlx": "save_mlx_lfm2", "hf": "save_hf_lfm2"}


@pytest.fixture(autouse=True, scope="module")
def _registered_family(family: str) -> Iterator[None]:
    before = TARGET_FAMILIES.get(family)
    register_target_family(family, f"specproof.engine.targets.{family}:load_spec")
    yield
    if before is None:
        TARGET_FAMILIES.pop(family, None)
    else:
        TARGET_FAMILIES[family] = before


@pytest.fixture(scope="module")
def save_lfm2(family: str) -> Callable[[Any, str], None]:
    return getattr(convert, _SAVERS[family])  # type: ignore[no-any-return]


@pytest.fixture
def target(proto: Any) -> Any:
    t = copy.deepcopy(proto)
    t.reset()
    return t


@pytest.mark.parametrize("k", [1, 4])
def test_spec_decoder_replay_is_lossless(target: Any, k: int) -> None:
    prompts = [REPETITIVE, list(b"abcabcabcabcab"), list(b"zq")]
    for prompt in prompts:
        expected = greedy_decode(target, prompt, 40).tokens
        gen = SpecDecoder(target, NgramDrafter(), k=k, rollback="replay").generate(prompt, 40)
        assert gen.tokens == expected, f"prompt {bytes(prompt)!r}"
        assert target.processed == len(prompt) + 40 - 1


class OracleDrafter:
    """Proposes the known greedy continuation, with ``draft[wrong]`` corrupted: drives the all-accepted
    (``wrong=None``) and the partially-accepted rollback paths on purpose."""

    def __init__(self, prompt: list[int], continuation: tuple[int, ...], vocab: int, wrong: int | None) -> None:
        self.full = [*prompt, *continuation]
        self.vocab = vocab
        self.wrong = wrong

    def propose(self, context: object, k: int) -> list[int]:
        n = len(context)  # type: ignore[arg-type]
        draft = self.full[n : n + k]
        if self.wrong is not None and len(draft) > self.wrong:
            draft[self.wrong] = (draft[self.wrong] + 1) % self.vocab
        return draft


@pytest.mark.parametrize("wrong", [None, 0, 2])
def test_oracle_drafts_all_and_partial_acceptance(target: Any, wrong: int | None) -> None:
    prompt = REPETITIVE[:12]
    expected = greedy_decode(target, prompt, 30).tokens
    drafter = OracleDrafter(prompt, expected, target.vocab_size, wrong)
    gen = SpecDecoder(target, drafter, k=4, rollback="replay").generate(prompt, 30)
    assert gen.tokens == expected
    assert gen.stats is not None
    if wrong is None:
        assert gen.stats.accepted == gen.stats.drafted and gen.stats.replay_forwards == 0
        assert gen.stats.mean_tokens_per_round == 5.0
    else:
        assert gen.steps is not None
        rejecting = [s for s in gen.steps if len(s.draft) > wrong]
        assert rejecting and all(len(s.accepted) == wrong + 1 for s in rejecting)
        assert gen.stats.replay_forwards >= len(rejecting)  # each of those rounds rolled back


def test_checkpoint_rollback_only_where_the_state_allows_it(target: Any) -> None:
    """Checkpoints where the framework's state can be had per position (transformers' LFM2), else refused."""
    if not callable(getattr(target, "forward_with_checkpoints", None)):
        with pytest.raises(InvalidSettingError, match="forward_with_checkpoints"):
            SpecDecoder(target, NgramDrafter(), rollback="checkpoint")
        return
    toks = REPETITIVE[:12]
    for i in range(6):
        target.reset()
        target.forward(toks[:3])
        _, checkpoints = target.forward_with_checkpoints(toks[3:9])
        assert [c.processed for c in checkpoints] == [4, 5, 6, 7, 8, 9]
        target.restore(checkpoints[i])
        fresh = copy.deepcopy(target)
        fresh.reset()
        fresh.forward(toks[: 4 + i])
        mine, theirs = target.state_arrays(), fresh.state_arrays()
        assert set(mine) == set(theirs)
        for name in mine:
            np.testing.assert_allclose(mine[name], theirs[name], atol=1e-4, err_msg=f"checkpoint {i}: {name}")
        np.testing.assert_allclose(target.forward([toks[4 + i]]), fresh.forward([toks[4 + i]]), atol=1e-4)
    gen = SpecDecoder(target, NgramDrafter(), k=4, rollback="checkpoint").generate(REPETITIVE[:20], 24)
    assert list(gen.tokens) == list(greedy_decode(copy.deepcopy(target), REPETITIVE[:20], 24).tokens)
    assert gen.stats is not None and gen.stats.replay_forwards == 0


def test_chunk_invariance_within_tolerance(target: Any) -> None:
    toks = REPETITIVE[:20]
    whole = target.forward(toks)
    assert whole.dtype == np.float32 and whole.shape == (20, target.vocab_size)
    target.reset()
    single = np.concatenate([target.forward([t]) for t in toks])
    target.reset()
    chunks = np.concatenate([target.forward(toks[:7]), target.forward(toks[7:8]), target.forward(toks[8:])])
    np.testing.assert_allclose(whole, single, rtol=0, atol=target.tie_tolerance)
    np.testing.assert_allclose(chunks, single, rtol=0, atol=target.tie_tolerance)


def test_processed_and_restore_to_zero(target: Any) -> None:
    s0 = target.snapshot()
    first = target.forward([1, 2, 3])
    assert target.processed == 3
    target.restore(s0)
    assert target.processed == 0
    np.testing.assert_array_equal(target.forward([1, 2, 3]), first)


def test_capacity_and_token_range_change_nothing(proto: Any) -> None:
    t = type(proto)(proto.model, max_context=8, name="small")
    t.forward([1, 2, 3, 4, 5, 6])
    before = t.state_arrays()
    with pytest.raises(CapacityError, match="max_context=8"):
        t.forward([1, 2, 3])
    with pytest.raises(TokenRangeError, match=r"tokens\[1\]=256"):
        t.forward([1, 256])
    with pytest.raises(TokenRangeError):
        t.forward([True])
    with pytest.raises(TokenRangeError):
        t.forward("ab")
    assert t.processed == 6
    after = t.state_arrays()
    assert set(before) == set(after)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    t.forward([7, 8])
    assert t.processed == 8


def test_encode_decode_and_describe(target: Any, family: str) -> None:
    assert target.decode(target.encode("héllo")) == "héllo"
    framework = {"mlx": "mlx-lm", "hf": "transformers"}[family]
    rollback = "checkpoint" if callable(getattr(target, "forward_with_checkpoints", None)) else "replay"
    assert framework in target.describe() and f"rollback={rollback}" in target.describe()


def test_spec_errors_are_clear(family: str) -> None:
    with pytest.raises(PluginError, match="unknown model"):
        load_target(f"{family}:gpt-huge")
    with pytest.raises(PluginError, match="no such local model directory"):
        load_target(f"{family}:/nonexistent/model/dir")
    with pytest.raises(PluginError, match="unknown override"):
        load_target(f"{family}:lfm2-tiny,colour=3")


def test_seed_override_changes_the_model(family: str) -> None:
    a = load_target(f"{family}:lfm2-tiny,seed=1,max_context=64")
    b = load_target(f"{family}:lfm2-tiny")
    assert a.max_context == 64
    assert not np.array_equal(a.forward([1, 2]), b.forward([1, 2]))


def test_local_path_loads_offline(tmp_path: object, family: str, save_lfm2: Callable[[Any, str], None]) -> None:
    path = str(tmp_path) + "/lfm2"
    ref = tiny_lfm2_reference(seed=2, max_context=64)
    save_lfm2(ref, path)
    t = load_target(f"{family}:{path}")
    assert t.max_context == 64 and t.vocab_size == 256
    np.testing.assert_allclose(t.forward([5, 6, 7]), ref.forward([5, 6, 7]), rtol=0, atol=5e-4)
