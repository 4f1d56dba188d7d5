"""The reference target's attention over padded key blocks, and its cheap copies.

A row attending to ``n`` keys sums over ``key_width(n)`` cache slots (``n`` rounded up to a
``KEY_BLOCK``), the slots past ``n`` weighted exactly 0, so the rows of one forward share one
call per width and still equal one-token forwards bit for bit. These tests draw random models
(every block kind, GQA groupings, MoE, huge weights that overflow) and random contexts that cross
the block boundaries, and compare a ``q``-row forward with ``q`` one-token forwards by their bytes
(a nan's sign aside).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproof.contract.errors import TargetContractError
from specproof.engine.targets._reference_blocks import KEY_BLOCK, key_runs, key_width
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid, default_config, moe_config


def _bits(a: np.ndarray) -> bytes:
    """The bytes of ``a`` with every nan made one nan: numpy's vector exp does not keep a nan's sign bit the same
    across array lengths (true before the padded blocks too); every other bit must match."""
    return np.where(np.isnan(a), np.float32(np.nan), a).astype(np.float32).tobytes()


@st.composite
def models(draw: st.DrawFn) -> ReferenceConfig:
    """Small random configs: any layer pattern with attention, any grouping, dense or MoE, any weight scale."""
    n_kv = draw(st.integers(1, 2))
    layers = draw(st.lists(st.sampled_from(["conv", "attn", "gdn"]), min_size=1, max_size=3))
    experts = draw(st.sampled_from([0, 0, 3]))
    return ReferenceConfig(
        vocab_size=24,
        d_model=8 * draw(st.integers(1, 3)),
        layers=(*layers, "attn"),
        n_heads=n_kv * draw(st.integers(1, 3)),
        n_kv_heads=n_kv,
        head_dim=draw(st.sampled_from([2, 4, 8])),
        ffn_dim=16,
        conv_kernel=draw(st.integers(1, 4)),
        gdn_heads=draw(st.integers(1, 2)),
        gdn_key_dim=4,
        gdn_value_dim=4,
        max_context=draw(st.integers(1, 3 * KEY_BLOCK)),
        n_experts=experts,
        experts_per_token=min(2, experts) or 2,
        expert_ffn_dim=8,
        init_scale=draw(st.sampled_from([0.5, 2.0, 40.0, 1e12])),  # 1e12 overflows to inf and nan
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=25, deadline=None)
@given(cfg=models(), data=st.data())
def test_q_row_forwards_are_bitwise_one_token_forwards(cfg: ReferenceConfig, data: st.DataObject) -> None:
    """Any chunking of a random context, on a random model, gives the bytes of one-token forwards."""
    length = data.draw(st.integers(1, cfg.max_context), label="context length")
    tokens = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), min_size=length, max_size=length))
    sizes = data.draw(st.lists(st.integers(1, 2 * KEY_BLOCK + 3), min_size=1, max_size=4))
    one, chunked = ReferenceHybrid(cfg), ReferenceHybrid(cfg)
    with np.errstate(all="ignore"):
        rows = [one.forward([t]) for t in tokens]
        got, i = [], 0
        while i < len(tokens):
            size = sizes[len(got) % len(sizes)]
            got.append(chunked.forward(tokens[i : i + size]))
            i += size
    assert _bits(np.concatenate(got)) == _bits(np.concatenate(rows))
    mine, theirs = chunked.state_arrays(), one.state_arrays()
    assert all(_bits(mine[name]) == _bits(theirs[name]) for name in mine)


def test_stale_non_finite_cache_slots_change_no_bit() -> None:
    """inf and nan left in the cache past ``processed`` (weighted 0) give the bits of a clean cache."""
    cfg = ReferenceConfig(max_context=3 * KEY_BLOCK)
    clean, poisoned = ReferenceHybrid(cfg), ReferenceHybrid(cfg)
    tokens = np.random.default_rng(1).integers(0, 256, 2 * KEY_BLOCK + 5).tolist()
    poisoned.forward(tokens[:30])
    poisoned._value_cache[:, :, 30:] = np.inf
    poisoned._value_cache[:, :, 40:50] = np.nan
    poisoned._keys_t[..., 30:] = np.nan
    clean.forward(tokens[:30])
    for chunk in (tokens[30:31], tokens[31:100], tokens[100:]):
        assert _bits(poisoned.forward(chunk)) == _bits(clean.forward(chunk))


def test_bits_do_not_depend_on_max_context() -> None:
    """The padding is a function of the row alone: the same weights give the same bits at any max_context."""
    tokens = np.random.default_rng(2).integers(0, 256, 150).tolist()
    small, large = ReferenceHybrid(ReferenceConfig(max_context=150)), ReferenceHybrid(ReferenceConfig(max_context=300))
    assert _bits(small.forward(tokens)) == _bits(large.forward(tokens))


@given(base=st.integers(0, 5 * KEY_BLOCK), q=st.integers(1, 4 * KEY_BLOCK))
def test_key_runs_cover_every_row_once_with_its_own_width(base: int, q: int) -> None:
    runs = key_runs(base, q)
    assert [row for lo, hi, _ in runs for row in range(lo, hi)] == list(range(q))
    for lo, hi, width in runs:
        assert width % KEY_BLOCK == 0 and all(key_width(base + i + 1) == width for i in range(lo, hi))


def test_key_width_rounds_up_to_a_block() -> None:
    assert [key_width(n) for n in (1, KEY_BLOCK, KEY_BLOCK + 1)] == [KEY_BLOCK, KEY_BLOCK, 2 * KEY_BLOCK]


# --------------------------------------------------------------------------- copies


@pytest.mark.parametrize("cfg", [default_config(), moe_config()], ids=["dense", "moe"])
def test_a_deep_copy_has_its_own_states_and_identity(cfg: ReferenceConfig) -> None:
    """Copies share the read-only weights but nothing they write: states, routing, snapshots."""
    model = ReferenceHybrid(cfg)
    model.forward([1, 2, 3])
    snap = model.snapshot()
    twin = copy.deepcopy(model)
    assert twin.processed == 3 and twin.last_routing == model.last_routing
    assert twin._weights is model._weights  # shared, never copied
    a, b = twin.forward([4, 5]), model.forward([4, 5])
    assert _bits(a) == _bits(b)
    twin.forward([6])
    assert model.processed == 5 and twin.processed == 6
    assert all(r.shape[0] == 2 for r in model.last_routing) and all(r.shape[0] == 1 for r in twin.last_routing)
    with pytest.raises(TargetContractError, match="different ReferenceHybrid instance"):
        twin.restore(snap)
    model.restore(snap)
    assert model.processed == 3


def test_a_copy_after_a_rollback_continues_as_the_original() -> None:
    """A copy holds only the valid KV slots (the rest zero): after a rollback, the slots past ``processed``
    still hold the rolled-back tokens' keys in the original, and neither continuation may see them."""
    model = ReferenceHybrid()
    model.forward(list(range(70)))
    snap = model.snapshot()
    model.forward(list(range(100, 160)))  # slots 70..129 written, then rolled back
    model.restore(snap)
    twin = copy.deepcopy(model)
    assert not twin._keys_t[..., 70:].any() and not twin._value_cache[:, :, 70:].any()
    tail = [5, 6, 7, 8, 9, 10, 11]
    assert _bits(twin.forward(tail)) == _bits(model.forward(tail))
    assert _bits(twin.forward([3])) == _bits(model.forward([3]))
