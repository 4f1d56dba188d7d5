"""The reference target's real-model features: LFM2-MoE's sigmoid router with an expert bias, Qwen3-Next's
gated shared expert and its gated attention (``ReferenceConfig.router``, ``shared_expert``, ``attn_output_gate``).

Each is judged against a computation written here from the Hugging Face formulas (transformers
``Lfm2MoeSparseMoeBlock.route_tokens_to_experts``, ``Qwen3NextSparseMoeBlock.forward``,
``Qwen3NextAttention.forward``), not against the reference's own code; all are off by default.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from specproof.coreml._families import TIED_EXPERTS, family_target
from specproof.engine import InvalidSettingError, ReferenceHybrid
from specproof.engine.targets._reference_blocks import DenseFfn, MoeFfn, SharedExpert, router_margins
from specproof.engine.targets._reference_routers import select_experts
from specproof.engine.targets.convert import check_lfm2_compatible
from specproof.engine.targets.reference import ReferenceConfig
from specproof.engine.targets.reference_spec import load_moe

SMALL = ReferenceConfig(layers=("conv", "attn", "gdn", "attn"), d_model=32, head_dim=8, ffn_dim=32, max_context=64)
SMALL_MOE = attrs.evolve(SMALL, n_experts=4, experts_per_token=2, expert_ffn_dim=16)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _hf_lfm2_route(logits: np.ndarray, bias: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """route_tokens_to_experts with use_expert_bias and norm_topk_prob, ties to the lower index (float64)."""
    scores = _sigmoid(logits)
    chosen = np.array([sorted(range(len(row)), key=lambda e: (-row[e], e))[:k] for row in scores + bias])
    w = np.take_along_axis(scores, chosen, axis=-1)
    return chosen, w / (w.sum(axis=-1, keepdims=True) + 1e-6)


# --------------------------------------------------------------------------- defaults


def test_every_feature_is_off_by_default_and_adds_no_tensor() -> None:
    cfg = ReferenceConfig()
    assert (cfg.router, cfg.shared_expert, cfg.attn_output_gate) == ("softmax", False, False)
    names = set(load_moe("").weights)
    assert not any("expert_bias" in n or "shared_expert" in n for n in names)
    assert ReferenceHybrid(SMALL).weights["model.layers.1.self_attn.q_proj.weight"].shape == (32, 32)
    assert "features=" not in ReferenceHybrid(SMALL_MOE).describe()


# --------------------------------------------------------------------------- the sigmoid router


def test_the_sigmoid_router_selects_with_the_bias_and_weighs_without_it() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (64, 6)).astype(np.float32)
    bias = rng.uniform(-1, 1, 6).astype(np.float32)
    chosen, w, ranked = select_experts(logits, 2, bias)
    want_chosen, want_w = _hf_lfm2_route(logits, bias, 2)
    np.testing.assert_array_equal(chosen, want_chosen)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)
    # the bias changed some selections (so leaving it out is visible) and none of the weights' values
    assert (np.sort(chosen, axis=1) != np.sort(_hf_lfm2_route(logits, 0 * bias, 2)[0], axis=1)).any()
    np.testing.assert_allclose(ranked, 4 * (_sigmoid(logits) + bias), atol=1e-6)  # margins in logit units


def test_sigmoid_ties_in_the_selection_scores_go_to_the_lower_index() -> None:
    logits = np.array([[0.3, 0.3, -2.0, 0.3], [0.0, 1.0, 0.0, 0.0]], np.float32)
    bias = np.array([0.2, 0.2, 0.0, 0.1], np.float32)
    chosen, _, ranked = select_experts(logits, 2, bias)
    assert chosen.tolist() == [[0, 1], [1, 0]]  # row 1: 0.5 + 0.2 (expert 0) above 0.5 + 0.1 (expert 3)
    margins = router_margins(ranked, chosen)
    # row 0: the exact 0/1 tie is no margin; 0 and 1 against 3 differ by 4 x 0.1
    np.testing.assert_allclose(margins[0], 0.4, rtol=1e-5)


def test_the_moe_block_adds_the_gated_shared_expert() -> None:
    rng = np.random.default_rng(7)
    d, f, n = 8, 6, 4

    def r(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.5, shape).astype(np.float32)

    def swiglu(x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray) -> np.ndarray:
        a = x @ w1.T
        return (a * _sigmoid(a) * (x @ w3.T)) @ w2.T

    experts = [(r(f, d), r(f, d), r(d, f)) for _ in range(n)]
    shared, gate, router, bias = (r(f, d), r(f, d), r(d, f)), r(1, d), r(n, d), r(n)
    block = MoeFfn(router, [DenseFfn(*e) for e in experts], 2, expert_bias=bias,
                   shared=SharedExpert(DenseFfn(*shared), gate))  # fmt: skip
    x = r(5, d)
    out, chosen, _ = block.route(x)
    want_chosen, w = _hf_lfm2_route(x @ router.T, bias, 2)
    want = np.zeros((5, d))
    for row in range(5):
        for slot, e in enumerate(want_chosen[row]):
            want[row] += w[row, slot] * swiglu(x[row : row + 1], *experts[e])[0]
    want += _sigmoid(x @ gate.T) * swiglu(x, *shared)
    np.testing.assert_array_equal(chosen, want_chosen)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- the attention output gate


def test_the_output_gate_is_each_heads_second_half_of_q_proj() -> None:
    """Gate rows of zero scale every head's output by sigmoid(0) = 1/2: exactly the ungated model with
    out_proj halved, if and only if the query rows are read where Qwen3-Next puts them."""
    plain = ReferenceHybrid(SMALL)
    w = plain.weights
    gated_w = dict(w)
    for i in (1, 3):
        a = f"model.layers.{i}.self_attn."
        q = w[a + "q_proj.weight"].reshape(SMALL.n_heads, 1, SMALL.head_dim, -1)
        gated_w[a + "q_proj.weight"] = np.concatenate((q, np.zeros_like(q)), axis=1).reshape(-1, SMALL.d_model)
        w[a + "out_proj.weight"] = w[a + "out_proj.weight"] * np.float32(0.5)
    gated = ReferenceHybrid(attrs.evolve(SMALL, attn_output_gate=True), weights=gated_w)
    halved = ReferenceHybrid(SMALL, weights=w)
    tokens = list(range(40, 60))
    np.testing.assert_array_equal(gated.forward(tokens), halved.forward(tokens))
    assert not np.array_equal(gated.state_arrays()["key_cache"], 0)


# --------------------------------------------------------------------------- the model


@pytest.mark.parametrize(
    "features",
    [{"router": "sigmoid"}, {"shared_expert": True, "attn_output_gate": True},
     {"router": "sigmoid", "shared_expert": True, "attn_output_gate": True}],
)  # fmt: skip
def test_features_keep_the_model_exactly_chunk_invariant(features: dict[str, object]) -> None:
    model = ReferenceHybrid(attrs.evolve(SMALL_MOE, **features))
    tokens = list(np.random.default_rng(1).integers(0, 256, 23))
    whole = model.forward(tokens)
    margins = model.last_router_margins
    model.reset()
    pieces = [model.forward(tokens[a:b]) for a, b in ((0, 1), (1, 8), (8, 9), (9, 23))]
    np.testing.assert_array_equal(whole, np.concatenate(pieces))
    assert len(margins) == 4 and all(m.shape == (23,) for m in margins)
    assert f"features={'sigmoid-router' if 'router' in features else 'shared-expert'}" in model.describe()


def test_the_families_carry_the_real_models_features_and_tie_in_the_selection() -> None:
    lfm2, qwen = family_target("lfm2-moe"), family_target("qwen3.6-moe")
    assert (lfm2.config.router, lfm2.config.shared_expert, lfm2.config.attn_output_gate) == ("sigmoid", False, False)
    assert (qwen.config.router, qwen.config.shared_expert, qwen.config.attn_output_gate) == ("softmax", True, True)
    a, b = TIED_EXPERTS
    for i in range(4):
        bias = lfm2.weights[f"model.layers.{i}.feed_forward.expert_bias"]
        assert bias[a] == bias[b] and np.abs(bias).max() > 0.1  # tied, and large enough to change selections
    lfm2.forward(list(range(32, 132)))
    tie_decided = [((r == a).any(axis=1) & ~(r == b).any(axis=1)).any() for r in lfm2.last_routing]
    assert any(tie_decided), "no selection tie decided at the top-k boundary"


# --------------------------------------------------------------------------- bad settings


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("router=topk", "router='topk'; one of softmax, sigmoid"),
     ("n_experts=0,router=sigmoid", "router='sigmoid' needs a mixture of experts"),
     ("n_experts=0,shared_expert=true", "shared_expert=True needs a mixture of experts"),
     ("shared_expert=maybe", "shared_expert='maybe' is not a valid bool"),
     ("attn_output_gate=2", "attn_output_gate='2' is not a valid bool")],
)  # fmt: skip
def test_bad_feature_settings_are_named(spec: str, needle: str) -> None:
    with pytest.raises(InvalidSettingError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_moe(spec)


def test_a_gated_attention_is_not_exported_as_lfm2() -> None:
    cfg = ReferenceConfig(layers=("conv", "attn"), d_model=32, head_dim=8, attn_output_gate=True)
    with pytest.raises(InvalidSettingError, match="attn_output_gate=True: LFM2's attention has no output gate"):
        check_lfm2_compatible(cfg, framework="hf")


def test_the_command_line_names_a_bad_router(capsys: pytest.CaptureFixture[str]) -> None:
    from specproof import cli

    assert cli.main(["certify", "target", "--target", "reference:router=topk", "--profile", "quick"]) == 2
    assert "ReferenceConfig.router='topk'; one of softmax, sigmoid" in capsys.readouterr().err
