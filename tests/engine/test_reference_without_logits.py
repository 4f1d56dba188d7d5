"""``ReferenceHybrid.forward_without_logits``: ``forward`` without the logits, the states bit for bit.

The judges (``JudgeMemo``) feed a prompt they never read the logits of with it, so it must leave
every state exactly as ``forward`` does: a dense model stops after the last block's state (a last
attention block only appends its keys and values), an MoE model runs the whole forward (its
routing is a result), and a subclass with its own ``forward`` is fed by that ``forward``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproof.conformance._judges import JudgeMemo
from specproof.contract.errors import CapacityError, TokenRangeError
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid, default_config


def _bits(arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    """Each state's bytes, every nan made one nan (numpy's exp does not keep a nan's sign across lengths)."""
    return {k: np.where(np.isnan(a), np.float32(np.nan), a).astype(np.float32).tobytes() for k, a in arrays.items()}


@st.composite
def configs(draw: st.DrawFn) -> ReferenceConfig:
    """Small random models whose last block is any kind, dense or MoE, at any weight scale."""
    experts = draw(st.sampled_from([0, 0, 3]))
    return ReferenceConfig(
        vocab_size=24,
        d_model=8 * draw(st.integers(1, 2)),
        layers=tuple(draw(st.lists(st.sampled_from(["conv", "attn", "gdn"]), min_size=1, max_size=4))),
        n_heads=2,
        n_kv_heads=draw(st.sampled_from([1, 2])),
        head_dim=4,
        ffn_dim=16,
        conv_kernel=draw(st.integers(1, 4)),
        gdn_heads=1,
        gdn_key_dim=4,
        gdn_value_dim=4,
        max_context=160,
        n_experts=experts,
        experts_per_token=min(2, experts) or 2,
        expert_ffn_dim=8,
        init_scale=draw(st.sampled_from([0.5, 2.0, 1e12])),  # 1e12 overflows to inf and nan
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=30, deadline=None)
@given(cfg=configs(), data=st.data())
def test_forward_without_logits_leaves_the_states_forward_leaves(cfg: ReferenceConfig, data: st.DataObject) -> None:
    """forward_without_logits(prefix) then forward(rest) gives forward's states and logits, byte for byte."""
    tokens = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), min_size=1, max_size=cfg.max_context))
    cut = data.draw(st.integers(0, len(tokens)), label="prefix fed without logits")
    fed, skipped = ReferenceHybrid(cfg), ReferenceHybrid(cfg)
    with np.errstate(all="ignore"):
        fed.forward(tokens[:cut])
        skipped.forward_without_logits(tokens[:cut])
        assert skipped.processed == fed.processed == cut
        assert _bits(skipped.state_arrays()) == _bits(fed.state_arrays())
        rest = _bits({"logits": fed.forward(tokens[cut:])})
        assert _bits({"logits": skipped.forward(tokens[cut:])}) == rest
    assert _bits(skipped.state_arrays()) == _bits(fed.state_arrays())


def test_forward_without_logits_refuses_what_forward_refuses_and_changes_nothing() -> None:
    model = ReferenceHybrid(ReferenceConfig(max_context=8))
    model.forward_without_logits([1, 2, 3])
    before = _bits(model.state_arrays())
    with pytest.raises(TokenRangeError, match=r"tokens\[1\]=999"):
        model.forward_without_logits([1, 999])
    with pytest.raises(CapacityError, match="exceeds max_context=8"):
        model.forward_without_logits([1] * 6)
    assert model.processed == 3 and _bits(model.state_arrays()) == before


class _CountingForward(ReferenceHybrid):
    """A subclass with a forward of its own (as a planted bug would have)."""

    calls = 0

    def forward(self, tokens: Any) -> Any:
        type(self).calls += 1
        return super().forward(tokens)


def test_a_subclass_forward_is_what_forward_without_logits_runs() -> None:
    model = _CountingForward(default_config())
    model.forward_without_logits([5, 6, 7])
    assert _CountingForward.calls == 1 and model.processed == 3


class _NoAdvance:
    """A judge model without ``forward_without_logits``: fed by ``forward``."""

    def __init__(self) -> None:
        self.inner = ReferenceHybrid(ReferenceConfig(max_context=256))
        self.forwards: list[int] = []

    def forward(self, tokens: list[int]) -> Any:
        self.forwards.append(len(tokens))
        return self.inner.forward(tokens)

    def reset(self) -> None:
        self.inner.reset()

    @property
    def processed(self) -> int:
        return self.inner.processed


def test_judges_skip_the_logits_where_they_can_be_and_fed_forwards_otherwise() -> None:
    prompt = [i % 24 for i in range(100)]
    judges = JudgeMemo()
    skipped = judges.at(lambda: ReferenceHybrid(ReferenceConfig(max_context=256)), prompt)
    plain = ReferenceHybrid(ReferenceConfig(max_context=256))
    plain.forward(prompt)
    assert _bits(skipped.state_arrays()) == _bits(plain.state_arrays())
    fed = judges.at(_NoAdvance, prompt)
    assert fed.forwards == [100] and fed.processed == 100
