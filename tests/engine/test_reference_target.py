"""Tests of the numpy reference target ``ReferenceHybrid``.

The central property is exact batch invariance: a q-token forward returns, bit for
bit, the rows of q one-token forwards, whatever the chunking, starting position or
restore history. Everything is compared with ``np.array_equal`` *and* ``tobytes``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproof.contract.errors import (
    CapacityError,
    InvalidSettingError,
    StaleSnapshotError,
    TargetContractError,
    TokenRangeError,
)
from specproof.engine.targets.reference import (
    ReferenceConfig,
    ReferenceHybrid,
    ReferenceSnapshot,
    default_config,
    moe_config,
)

# --------------------------------------------------------------------------- helpers

ODD_CONFIGS = {
    # no GQA grouping (group 1), no short-conv history (kernel 1), untied head, narrow GDN values
    "odd": ReferenceConfig(
        vocab_size=50,
        d_model=24,
        layers=("gdn", "attn", "conv"),
        n_heads=2,
        n_kv_heads=2,
        head_dim=8,
        ffn_dim=40,
        conv_kernel=1,
        gdn_heads=3,
        gdn_key_dim=8,
        gdn_value_dim=4,
        max_context=64,
        tie_embeddings=False,
        seed=7,
    ),
    # a single attention head, a long conv kernel, top-1 routing over 3 experts
    "single-head-moe": ReferenceConfig(
        vocab_size=40,
        d_model=16,
        layers=("attn", "conv", "gdn", "attn"),
        n_heads=1,
        n_kv_heads=1,
        head_dim=16,
        conv_kernel=4,
        gdn_heads=1,
        gdn_key_dim=4,
        gdn_value_dim=8,
        max_context=64,
        n_experts=3,
        experts_per_token=1,
        expert_ffn_dim=24,
        seed=11,
    ),
}


def assert_bitwise(a: np.ndarray, b: np.ndarray, what: str = "") -> None:
    assert a.dtype == b.dtype, what
    assert a.shape == b.shape, what
    assert np.array_equal(a, b), what
    assert a.tobytes() == b.tobytes(), what


def assert_states_equal(a: ReferenceHybrid, b: ReferenceHybrid) -> None:
    sa, sb = a.state_arrays(), b.state_arrays()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert_bitwise(sa[name], sb[name], name)
    assert a.processed == b.processed


def one_by_one(target: ReferenceHybrid, tokens: Sequence[int]) -> np.ndarray:
    """Logit rows from one-token forwards."""
    rows = [target.forward([t]) for t in tokens]
    return np.concatenate(rows) if rows else np.zeros((0, target.vocab_size), np.float32)


def chunked(target: ReferenceHybrid, tokens: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """Logit rows from forwards of the given chunk sizes (cycled), covering all of ``tokens``."""
    out, i, j = [], 0, 0
    while i < len(tokens):
        size = sizes[j % len(sizes)]
        out.append(target.forward(tokens[i : i + size]))
        i += size
        j += 1
    return np.concatenate(out) if out else np.zeros((0, target.vocab_size), np.float32)


@pytest.fixture(scope="module")
def model() -> ReferenceHybrid:
    return ReferenceHybrid()


@pytest.fixture(scope="module")
def fresh() -> ReferenceHybrid:
    return ReferenceHybrid()


@pytest.fixture
def target(model: ReferenceHybrid) -> ReferenceHybrid:
    model.reset()
    return model


_TARGETS: dict[str, tuple[ReferenceHybrid, ReferenceHybrid]] = {}


def pair(name: str) -> tuple[ReferenceHybrid, ReferenceHybrid]:
    """Two reset targets of one config (built once per module)."""
    if name not in _TARGETS:
        cfg = {"default": default_config(), "moe": moe_config(), **ODD_CONFIGS}[name]
        _TARGETS[name] = (ReferenceHybrid(cfg), ReferenceHybrid(cfg))
    a, b = _TARGETS[name]
    a.reset()
    b.reset()
    return a, b


tokens_st = st.lists(st.integers(0, 39), min_size=1, max_size=30)  # valid for every config here
chunks_st = st.lists(st.integers(1, 9), min_size=1, max_size=5)
config_names = st.sampled_from(["default", "moe", "odd", "single-head-moe"])

# --------------------------------------------------------------------------- batch invariance


@settings(max_examples=30, deadline=None)
@given(name=config_names, prefix=st.lists(st.integers(0, 39), max_size=25), body=tokens_st, sizes=chunks_st)
def test_chunked_forward_is_bitwise_one_token_forwards(
    name: str, prefix: list[int], body: list[int], sizes: list[int]
) -> None:
    """Any chunking of any sequence, from any start, gives the rows of one-token forwards, bit for bit."""
    a, b = pair(name)
    seq = prefix + body
    expected = one_by_one(a, seq)
    if prefix:
        b.forward(prefix)  # the start position is len(prefix)
    got = chunked(b, body, sizes)
    assert_bitwise(got, expected[len(prefix) :])
    assert_states_equal(a, b)


@pytest.mark.parametrize("name", ["default", "moe"])
def test_every_q_from_1_to_9_at_many_positions(name: str) -> None:
    """Every q in 1..9 at several starting positions, over random byte sequences."""
    a, b = pair(name)
    rng = np.random.default_rng(5)
    seq = rng.integers(0, 256, 130).tolist()
    expected = one_by_one(a, seq)
    pos = 0
    for q in [*range(1, 10), *range(9, 0, -1), 7, 3, 9, 1, 5]:
        got = b.forward(seq[pos : pos + q])
        assert_bitwise(got, expected[pos : pos + q], f"q={q} at {pos}")
        pos += q
    # a whole-prefix forward also equals the rows (long prefill, q = 60)
    b.reset()
    assert_bitwise(b.forward(seq[:60]), expected[:60])


@pytest.mark.parametrize("name", ["default", "moe"])
def test_random_sweep_bitwise(name: str) -> None:
    """25 random byte sequences: random start (0..150), random chunk sizes in 1..9, with restores."""
    a, b = pair(name)
    rng = np.random.default_rng(17)
    for trial in range(25):
        a.reset()
        b.reset()
        start = int(rng.integers(0, 151))
        seq = rng.integers(0, 256, start + 30).tolist()
        expected = one_by_one(a, seq)
        b.forward(seq[:start])
        if trial % 3 == 0:  # detour: snapshot, junk, restore
            snap = b.snapshot()
            b.forward(rng.integers(0, 256, int(rng.integers(1, 10))).tolist())
            b.restore(snap)
        sizes = rng.integers(1, 10, 8).tolist()
        assert_bitwise(chunked(b, seq[start:], sizes), expected[start:], f"trial {trial}")
        assert_states_equal(a, b)


def test_invariance_up_to_max_context() -> None:
    """Chunks that fill the context exactly (odd config, max_context 64) match one-token forwards."""
    a, b = pair("odd")
    seq = np.random.default_rng(3).integers(0, 50, 64).tolist()
    expected = one_by_one(a, seq)
    assert_bitwise(chunked(b, seq, [9, 8, 1, 9, 9, 2, 9, 9, 8]), expected)
    assert b.processed == 64 == b.max_context


@settings(max_examples=20, deadline=None)
@given(
    name=config_names, prefix=tokens_st, junk=tokens_st, rest=tokens_st, sizes=chunks_st, via_checkpoint=st.booleans()
)
def test_invariance_after_restore(
    name: str, prefix: list[int], junk: list[int], rest: list[int], sizes: list[int], via_checkpoint: bool
) -> None:
    """Snapshot (or checkpoint), feed junk, restore, continue in chunks: rows equal a fresh target's."""
    a, b = pair(name)
    expected = one_by_one(a, prefix + rest)
    if via_checkpoint:
        b.forward(prefix[:-1])
        _, checkpoints = b.forward_with_checkpoints([prefix[-1], *junk])
        b.restore(checkpoints[0])
    else:
        b.forward(prefix)
        snap = b.snapshot()
        b.forward(junk)
        b.restore(snap)
    assert b.processed == len(prefix)
    assert_bitwise(chunked(b, rest, sizes), expected[len(prefix) :])
    assert_states_equal(a, b)


def test_single_token_rows_do_not_depend_on_batch_layout(fresh: ReferenceHybrid) -> None:
    """numpy integer arrays, tuples, bytes and lists of numpy ints give the same bits."""
    seq = list(b"specproof!")
    outs = []
    for form in (seq, tuple(seq), bytes(seq), np.array(seq, dtype=np.uint8), [np.int64(t) for t in seq]):
        fresh.reset()
        outs.append(fresh.forward(form))  # type: ignore[arg-type]
    for out in outs[1:]:
        assert_bitwise(out, outs[0])


# --------------------------------------------------------------------------- basic contract


@pytest.mark.parametrize("name", ["default", "moe", "odd"])
def test_shapes_finite_and_processed(name: str) -> None:
    t, _ = pair(name)
    assert t.processed == 0
    logits = t.forward([1, 2, 3])
    assert logits.shape == (3, t.vocab_size) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert t.processed == 3
    assert t.forward([4]).shape == (1, t.vocab_size)
    assert t.processed == 4
    empty = t.forward([])
    assert empty.shape == (0, t.vocab_size) and empty.dtype == np.float32
    assert t.processed == 4
    logits, checkpoints = t.forward_with_checkpoints([])
    assert logits.shape == (0, t.vocab_size) and checkpoints == []


def test_state_arrays_names_shapes_and_copies(target: ReferenceHybrid) -> None:
    cfg = target.config
    target.forward(list(range(10)))
    states = target.state_arrays()
    assert set(states) == {"key_cache", "value_cache", "conv_state", "rec_state"}
    assert states["key_cache"].shape == (2, cfg.n_kv_heads, 10, cfg.head_dim)
    assert states["value_cache"].shape == (2, cfg.n_kv_heads, 10, cfg.head_dim)
    assert states["conv_state"].shape == (4, cfg.gdn_conv_dim, cfg.conv_kernel - 1)
    assert states["rec_state"].shape == (1, cfg.gdn_heads, cfg.gdn_key_dim, cfg.gdn_value_dim)
    assert all(a.dtype == np.float32 for a in states.values())
    # the conv blocks' rows are d_model wide, zero-padded up to the GDN's width
    assert not states["conv_state"][0, cfg.d_model :].any()
    assert states["conv_state"][0, : cfg.d_model].any() and states["rec_state"].any()
    for a in states.values():
        a[...] = 0.0  # copies: the target is unaffected
    assert target.state_arrays()["rec_state"].any()


def test_no_layers_of_a_kind_give_empty_state_arrays() -> None:
    t = ReferenceHybrid(ReferenceConfig(layers=("attn",), max_context=16))
    t.forward([1, 2])
    s = t.state_arrays()
    assert s["conv_state"].shape[0] == 0 and s["rec_state"].shape[0] == 0
    assert s["key_cache"].shape == (1, 2, 2, 16)
    t2 = ReferenceHybrid(ReferenceConfig(layers=("conv", "gdn"), max_context=16))
    t2.forward([1, 2])
    assert t2.state_arrays()["key_cache"].shape == (0, 2, 2, 16)


def test_causality(target: ReferenceHybrid, fresh: ReferenceHybrid) -> None:
    """Row i does not depend on tokens after i."""
    fresh.reset()
    seq_a = [5, 6, 7, 8, 9, 10, 11, 12]
    seq_b = [5, 6, 7, 8, 200, 3, 99, 1]
    la = target.forward(seq_a)
    lb = fresh.forward(seq_b)
    assert_bitwise(la[:4], lb[:4])  # the sequences first differ at position 4
    assert not np.array_equal(la[4], lb[4])


def test_reset_gives_a_fresh_target(target: ReferenceHybrid, fresh: ReferenceHybrid) -> None:
    fresh.reset()
    target.forward(list(range(40)))
    target.reset()
    assert target.processed == 0
    assert_states_equal(target, fresh)
    assert_bitwise(target.forward([1, 2, 3]), fresh.forward([1, 2, 3]))


# --------------------------------------------------------------------------- errors change nothing


def test_capacity_error_changes_nothing() -> None:
    t = ReferenceHybrid(attrs.evolve(default_config(), max_context=12))
    t.forward(list(range(10)))
    before, snap = t.state_arrays(), t.snapshot()
    with pytest.raises(CapacityError, match=r"processed=10.*len\(tokens\)=3.*max_context=12"):
        t.forward([1, 2, 3])
    with pytest.raises(CapacityError):
        t.forward_with_checkpoints([1, 2, 3])
    after = t.state_arrays()
    for name in before:
        assert_bitwise(before[name], after[name], name)
    assert t.snapshot() == snap and t.processed == 10
    assert t.forward([1, 2]).shape == (2, 256)  # filling it exactly is fine
    assert t.processed == 12
    with pytest.raises(CapacityError):
        t.forward([0])
    assert t.forward([]).shape == (0, 256)


@pytest.mark.parametrize(
    ("tokens", "pattern"),
    [
        ([1, 2, 256], r"tokens\[2\]=256 is outside \[0, 256\)"),
        ([-1], r"tokens\[0\]=-1 is outside"),
        ([3, True], r"tokens\[1\]=True \(bool\) is not an integer"),
        ([3, 4, 1.0], r"tokens\[2\]=1.0 \(float\) is not an integer"),
        ([np.bool_(True)], r"tokens\[0\]=.*is not an integer"),
        (np.array([1, 300, 2]), r"tokens\[1\]=300 is outside"),
        (np.array([1.0, 2.0]), r"not an integer token id"),
        (np.array([True]), r"not an integer token id"),
        (np.array([[1, 2]]), r"1-D"),
        ("abc", r"sequence of ints"),
        (5, r"sequence of ints"),
    ],
)
def test_token_range_errors_change_nothing(target: ReferenceHybrid, tokens: object, pattern: str) -> None:
    target.forward([7, 8, 9])
    before = target.state_arrays()
    with pytest.raises(TokenRangeError, match=pattern):
        target.forward(tokens)  # type: ignore[arg-type]
    with pytest.raises(TokenRangeError):
        target.forward_with_checkpoints(tokens)  # type: ignore[arg-type]
    after = target.state_arrays()
    for name in before:
        assert_bitwise(before[name], after[name], name)
    assert target.processed == 3


def test_bad_token_beats_capacity_and_both_change_nothing() -> None:
    t = ReferenceHybrid(attrs.evolve(default_config(), max_context=4))
    t.forward([1, 2, 3])
    with pytest.raises(TokenRangeError):
        t.forward([1, 999])
    with pytest.raises(CapacityError):
        t.forward([1, 2])
    assert t.processed == 3


# --------------------------------------------------------------------------- snapshots and checkpoints


@settings(max_examples=10, deadline=None)
@given(name=config_names, prefix=tokens_st, more=tokens_st, after=tokens_st)
def test_restore_then_forward_equals_fresh_target(
    name: str, prefix: list[int], more: list[int], after: list[int]
) -> None:
    a, b = pair(name)
    b.forward(prefix)
    snap = b.snapshot()
    b.forward(more)
    b.restore(snap)
    assert b.processed == len(prefix)
    a.forward(prefix)
    assert_states_equal(a, b)
    assert_bitwise(b.forward(after), a.forward(after))


@settings(max_examples=10, deadline=None)
@given(name=config_names, prefix=st.lists(st.integers(0, 39), max_size=12), body=tokens_st)
def test_checkpoints_equal_snapshots_after_each_token(name: str, prefix: list[int], body: list[int]) -> None:
    a, b = pair(name)
    a.forward(prefix)
    b.forward(prefix)
    logits, checkpoints = b.forward_with_checkpoints(body)
    assert len(checkpoints) == len(body)
    rows = []
    for i, tok in enumerate(body):
        rows.append(a.forward([tok]))
        snap = a.snapshot()
        ck = checkpoints[i]
        assert isinstance(ck, ReferenceSnapshot)
        assert ck == snap
        assert ck.processed == len(prefix) + i + 1
        assert_bitwise(ck.conv_state, snap.conv_state)
        assert_bitwise(ck.rec_state, snap.rec_state)
    assert_bitwise(logits, np.concatenate(rows))
    assert checkpoints[-1] == b.snapshot()
    # restoring checkpoint j leaves the target exactly where plain decoding of body[:j+1] does
    j = len(body) // 2
    b.restore(checkpoints[j])
    a.reset()
    a.forward(prefix + body[: j + 1])
    assert_states_equal(a, b)


def test_forward_with_checkpoints_equals_forward(target: ReferenceHybrid, fresh: ReferenceHybrid) -> None:
    fresh.reset()
    seq = list(b"checkpoints cost no extra forward")
    logits, _ = target.forward_with_checkpoints(seq)
    assert_bitwise(logits, fresh.forward(seq))
    assert_states_equal(target, fresh)


def test_snapshot_arrays_are_read_only_copies(target: ReferenceHybrid) -> None:
    target.forward([1, 2, 3])
    snap = target.snapshot()
    with pytest.raises(ValueError):
        snap.conv_state[...] = 0.0
    _, cks = target.forward_with_checkpoints([4, 5])
    assert isinstance(cks[0], ReferenceSnapshot)
    with pytest.raises(ValueError):
        cks[0].rec_state[...] = 0.0
    assert snap != target.snapshot()
    target.restore(snap)
    assert snap == target.snapshot()
    assert hash(snap) == hash(target.snapshot())


def test_stale_snapshot_detected(target: ReferenceHybrid) -> None:
    """Snapshot at 10, restore one at 5, feed 3 different tokens: the one at 10 is stale."""
    target.forward(list(range(5)))
    at5 = target.snapshot()
    target.forward(list(range(5, 10)))
    at10 = target.snapshot()
    target.restore(at5)
    target.restore(at10)  # nothing was overwritten yet: still valid
    assert target.processed == 10
    target.restore(at5)
    target.forward([100, 101, 102])
    before = target.state_arrays()
    with pytest.raises(StaleSnapshotError, match=r"processed=10.*KV slot 5"):
        target.restore(at10)
    after = target.state_arrays()
    for name in before:
        assert_bitwise(before[name], after[name], name)
    target.restore(at5)  # its prefix is intact
    assert target.processed == 5


def test_stale_checkpoint_detected(target: ReferenceHybrid) -> None:
    target.forward([1, 2, 3])
    _, cks = target.forward_with_checkpoints([4, 5, 6, 7])
    target.restore(cks[1])  # processed 5
    target.forward([9])  # overwrites slot 5
    target.restore(cks[1])  # its prefix (slots 0..4) is intact
    with pytest.raises(StaleSnapshotError):
        target.restore(cks[3])


def test_reset_makes_earlier_snapshots_stale(target: ReferenceHybrid) -> None:
    target.forward([1, 2, 3])
    snap = target.snapshot()
    target.reset()
    with pytest.raises(StaleSnapshotError):
        target.restore(snap)
    empty = target.snapshot()
    target.forward([4])
    target.restore(empty)
    assert target.processed == 0


def test_foreign_snapshot_rejected(target: ReferenceHybrid, fresh: ReferenceHybrid) -> None:
    fresh.reset()
    fresh.forward([1])
    with pytest.raises(TargetContractError, match="different ReferenceHybrid instance"):
        target.restore(fresh.snapshot())
    with pytest.raises(TargetContractError, match="expected a ReferenceSnapshot"):
        target.restore({"processed": 0})
    assert target.processed == 0


# --------------------------------------------------------------------------- config and weights


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"n_kv_heads": 3}, r"ReferenceConfig.n_kv_heads=3 must divide n_heads=4"),
        ({"vocab_size": 0}, r"ReferenceConfig.vocab_size=0 must be an integer >= 1"),
        ({"d_model": 2.5}, r"ReferenceConfig.d_model=2.5"),
        ({"head_dim": True}, r"ReferenceConfig.head_dim=True"),
        ({"head_dim": 7}, r"ReferenceConfig.head_dim=7 must be even"),
        ({"layers": ()}, r"ReferenceConfig.layers=\(\) must name at least one block"),
        ({"layers": ("conv", "mamba")}, r"ReferenceConfig.layers\[1\]='mamba'"),
        ({"layers": "conv"}, r"ReferenceConfig.layers='conv'"),
        ({"n_experts": 2, "experts_per_token": 3}, r"experts_per_token=3 must be <= n_experts=2"),
        ({"n_experts": -1}, r"ReferenceConfig.n_experts=-1"),
        ({"norm_eps": 0.0}, r"ReferenceConfig.norm_eps=0.0 must be a finite number > 0"),
        ({"init_scale": float("nan")}, r"ReferenceConfig.init_scale=nan"),
        ({"max_context": 0}, r"ReferenceConfig.max_context=0"),
        ({"seed": -2}, r"ReferenceConfig.seed=-2"),
        ({"tie_embeddings": "yes"}, r"ReferenceConfig.tie_embeddings='yes'"),
    ],
)
def test_config_validation(changes: dict[str, object], pattern: str) -> None:
    with pytest.raises(InvalidSettingError, match=pattern):
        ReferenceConfig(**changes)  # type: ignore[arg-type]


def test_config_defaults_and_variants() -> None:
    cfg = default_config()
    assert cfg.layers == ("conv", "attn", "conv", "gdn", "conv", "attn")
    assert (cfg.vocab_size, cfg.d_model, cfg.max_context, cfg.n_experts) == (256, 64, 4096, 0)
    assert ReferenceConfig(layers=["attn", "conv"]).layers == ("attn", "conv")  # type: ignore[arg-type]
    moe = moe_config()
    assert moe.is_moe and moe.n_experts >= moe.experts_per_token
    assert attrs.evolve(moe, n_experts=0) == attrs.evolve(default_config(), experts_per_token=moe.experts_per_token)
    line = ReferenceHybrid(moe).describe()
    assert "\n" not in line and "moe" in line and "max_context=4096" in line and "conv+attn+conv+gdn" in line
    assert "dense" in ReferenceHybrid().describe()


def test_seeded_weights_are_reproducible_and_seed_dependent() -> None:
    a, b = ReferenceHybrid(), ReferenceHybrid()
    c = ReferenceHybrid(attrs.evolve(default_config(), seed=1))
    assert_bitwise(a.forward([1, 2]), b.forward([1, 2]))
    assert not np.array_equal(a.forward([3]), c.forward([1, 2, 3])[2:])


@pytest.mark.parametrize("name", ["default", "moe", "odd"])
def test_models_of_one_config_are_independent(name: str) -> None:
    # the seeded weights, blocks and RoPE tables are made once per config and shared: only the states are a model's
    a, _ = pair(name)
    b = ReferenceHybrid(a.config)
    before = b.forward([3, 1, 4])
    b.reset()
    a.forward([7] * 40)
    a.forward([2, 7])
    assert b.processed == 0
    assert_bitwise(b.forward([3, 1, 4]), before)
    longer = ReferenceHybrid(attrs.evolve(a.config, max_context=a.config.max_context + 1))
    assert_bitwise(longer.forward([3, 1, 4]), before)


@pytest.mark.parametrize("name", ["default", "moe", "odd"])
def test_weights_round_trip(name: str) -> None:
    a, _ = pair(name)
    w = a.weights
    b = ReferenceHybrid(a.config, weights={k: v.copy() for k, v in w.items()})
    seq = [3, 1, 4, 1, 5, 9, 2, 6]
    assert_bitwise(a.forward(seq), b.forward(seq))
    assert "model.embed_tokens.weight" in w and "model.embedding_norm.weight" in w
    assert ("lm_head.weight" in w) == (not a.config.tie_embeddings)


def test_weights_are_read_only_and_names_follow_hf(model: ReferenceHybrid) -> None:
    w = model.weights
    with pytest.raises(ValueError):
        w["model.embed_tokens.weight"][0, 0] = 1.0
    assert w["model.layers.0.conv.in_proj.weight"].shape == (192, 64)
    assert w["model.layers.0.conv.conv.weight"].shape == (64, 1, 3)
    assert w["model.layers.1.self_attn.q_proj.weight"].shape == (64, 64)
    assert w["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert w["model.layers.1.self_attn.q_layernorm.weight"].shape == (16,)
    assert w["model.layers.3.linear_attn.in_proj_qkv.weight"].shape == (96, 64)
    assert w["model.layers.3.linear_attn.conv1d.weight"].shape == (96, 1, 3)
    assert w["model.layers.3.linear_attn.A_log"].shape == (2,)
    assert w["model.layers.5.feed_forward.w2.weight"].shape == (64, 128)
    w.clear()  # a copy of the mapping: the model keeps its weights
    assert model.weights


def test_weights_validation() -> None:
    base = ReferenceHybrid().weights
    missing = {k: v for k, v in base.items() if k != "model.layers.2.conv.out_proj.weight"}
    with pytest.raises(InvalidSettingError, match=r"missing tensor 'model.layers.2.conv.out_proj.weight'"):
        ReferenceHybrid(weights=missing)
    with pytest.raises(InvalidSettingError, match=r"unexpected tensor 'lm_head.weight'"):
        ReferenceHybrid(weights={**base, "lm_head.weight": base["model.embed_tokens.weight"]})
    bad = dict(base)
    bad["model.layers.1.self_attn.k_proj.weight"] = np.zeros((16, 64), np.float32)
    with pytest.raises(InvalidSettingError, match=r"'model.layers.1.self_attn.k_proj.weight' has shape \(16, 64\)"):
        ReferenceHybrid(weights=bad)
    bad["model.layers.1.self_attn.k_proj.weight"] = np.full((32, 64), np.nan, np.float32)
    with pytest.raises(InvalidSettingError, match=r"non-finite"):
        ReferenceHybrid(weights=bad)
    # float64 weights are accepted and stored as float32
    t = ReferenceHybrid(weights={k: v.astype(np.float64) for k, v in base.items()})
    assert all(v.dtype == np.float32 for v in t.weights.values())


# --------------------------------------------------------------------------- mixture of experts


def test_moe_routing_recorded() -> None:
    a, b = pair("moe")
    cfg = a.config
    seq = list(b"route me, please")
    a.forward(seq)
    routing = a.last_routing
    assert len(routing) == len(cfg.layers)
    for r in routing:
        assert r.shape == (len(seq), cfg.experts_per_token) and r.dtype == np.int64
        assert ((r >= 0) & (r < cfg.n_experts)).all()
        assert all(len(set(row)) == cfg.experts_per_token for row in r.tolist())
    touched = a.last_experts_touched
    assert touched == tuple(frozenset(r.ravel().tolist()) for r in routing)
    # the routing of a q-token forward is the routing of its one-token forwards, stacked
    per_token = []
    for t in seq:
        b.forward([t])
        per_token.append(b.last_routing)
    for layer, r in enumerate(routing):
        assert np.array_equal(r, np.concatenate([p[layer] for p in per_token]))
    # a verify forward reads the union of its positions' experts: at least one step's worth
    assert all(len(s) >= cfg.experts_per_token for s in touched)
    b.forward([])
    assert all(r.shape == (0, cfg.experts_per_token) for r in b.last_routing)


def test_parameter_bytes() -> None:
    dense = ReferenceHybrid().parameter_bytes()
    assert dense["per_expert"] == 0
    assert dense["dense"] == sum(v.nbytes for v in ReferenceHybrid().weights.values())
    moe = ReferenceHybrid(moe_config())
    pb = moe.parameter_bytes()
    cfg = moe.config
    assert pb["per_expert"] == 3 * cfg.expert_ffn_dim * cfg.d_model * 4
    total = sum(v.nbytes for v in moe.weights.values())
    assert pb["dense"] + pb["per_expert"] * cfg.n_experts * len(cfg.layers) == total
    assert ReferenceHybrid(attrs.evolve(default_config(), layers=("attn",))).last_routing == ()


# --------------------------------------------------------------------------- the default text is varied


def _greedy(target: ReferenceHybrid, prompt: list[int], n: int) -> list[int]:
    target.reset()
    target.forward(prompt[:-1])
    pending, out = prompt[-1], []
    for _ in range(n):
        row = target.forward([pending])[0]
        pending = int(np.argmax(row))  # np.argmax returns the lowest index on ties
        out.append(pending)
    return out


@pytest.mark.parametrize("cfg_name", ["default", "moe"])
def test_default_model_produces_varied_prompt_dependent_text(cfg_name: str) -> None:
    """Over 20 random byte prompts of length 16, greedy-decode 48 tokens each (one-token forwards).

    Required: at least 15 distinct continuations; on average at least 8 distinct tokens
    per continuation; no continuation where a single token fills more than 50% of it.
    """
    target, _ = pair(cfg_name)
    rng = np.random.default_rng(2024)
    continuations = [tuple(_greedy(target, rng.integers(0, 256, 16).tolist(), 48)) for _ in range(20)]
    assert len(set(continuations)) >= 15
    assert np.mean([len(set(c)) for c in continuations]) >= 8
    assert max(max(c.count(t) for t in set(c)) / len(c) for c in continuations) <= 0.5
