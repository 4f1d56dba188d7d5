"""The ``trained-small`` draft model: it loads, matches its record, drafts for ``trained`` losslessly.

Its record's figures (held-out bits per byte, top-1 agreement with ``trained``, greedy agreement
with the reference) are recomputed by ``tests/_hybrid_oracle.py``, an independent numpy copy of
the model and of the held-out split: neither the package's loader nor the training script.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import numpy as np
import pytest

import _hybrid_oracle as oracle
from specproof.cli import main
from specproof.engine import InvalidSettingError, PluginError, ReferenceHybrid, SpecDecoder, greedy_decode
from specproof.engine.drafters import ModelDrafter, NgramDrafter
from specproof.fixtures import (
    load_trained_small_target,
    load_trained_small_weights,
    trained_config,
    trained_small_config,
    trained_small_metadata,
)
from specproof.plugins import load_target, target_families


def test_loads_and_matches_its_record() -> None:
    meta = trained_small_metadata()
    cfg = trained_small_config()
    target = load_trained_small_target()
    assert isinstance(target, ReferenceHybrid) and target.config == cfg
    weights = load_trained_small_weights()
    assert set(weights) == set(ReferenceHybrid(cfg).weights)
    assert sum(w.size for w in weights.values()) == meta["weights"]["parameters"]
    blob = resources.files("specproof.fixtures").joinpath("data", "trained-small.npz").read_bytes()
    assert len(blob) == meta["weights"]["bytes"] <= 1024 * 1024
    assert hashlib.sha256(blob).hexdigest() == meta["weights"]["sha256"]
    assert "trained-small" in target_families() and load_target("trained-small").config == cfg


def test_record_says_how_it_was_made() -> None:
    meta = trained_small_metadata()
    training = meta["training"]
    for field in ("command", "seed", "steps", "train_seconds", "total_seconds", "script_sha256", "torch"):
        assert field in training, field
    # a claim about the training run, not a figure of the weights: nothing here can recompute it
    assert training["total_seconds"] <= 600  # the budget: at most 10 minutes on this machine
    assert training["command"].startswith("python scripts/train_draft.py")
    json.dumps(meta)


def test_greedy_matches_the_independent_model() -> None:
    """What the record's ``torch_vs_reference.same_greedy`` claims, recomputed against the oracle."""
    record = oracle.load_record("trained-small")
    independent = oracle.OracleLM(record["config"], oracle.packaged_weights("trained-small"))
    target = load_trained_small_target()
    for prompt in (b"def add(a, b):\n    return", b"The quick brown fox"):
        target.reset()
        np.testing.assert_allclose(target.forward(list(prompt)), independent.logits(list(prompt)), rtol=0, atol=1e-4)
        assert list(greedy_decode(target, list(prompt), 24).tokens) == independent.greedy(list(prompt), 24), prompt


needs_recorded_stdlib = pytest.mark.skipif(
    not oracle.same_stdlib(),
    reason="the held-out split is files of the CPython 3.11.7 standard library the records were measured on",
)


def _heldout() -> tuple[dict[str, float], np.ndarray, np.ndarray, np.ndarray]:
    """The record's held-out figures; per sampled window: the draft's bits, the teacher's, top-1 agreement."""
    small, small_top = oracle.scored_sample("trained-small")
    teacher, teacher_top = oracle.scored_sample("trained")
    return oracle.load_record("trained-small")["heldout"], small, teacher, (small_top == teacher_top).mean(-1)


def _problems(held: dict[str, float], small: np.ndarray, teacher: np.ndarray, agree: np.ndarray) -> list[str]:
    n = held["windows"]
    found = [
        oracle.judge_figure(held["bits_per_byte"], small, n, "bits/byte"),
        # paired with the teacher on the same windows: the text's difficulty cancels, a tighter check
        oracle.judge_figure(
            held["bits_per_byte"] - held["teacher_bits_per_byte"], small - teacher, n, "bits/byte over the teacher's"
        ),
        oracle.judge_figure(held["top1_agreement_with_teacher"], agree, n, "top-1 agreement"),
    ]
    return [p for p in found if p is not None]


@needs_recorded_stdlib
def test_heldout_figures_recomputed() -> None:
    held, small, teacher, agree = _heldout()
    assert held["teacher_bits_per_byte"] == oracle.load_record("trained")["heldout"]["bits_per_byte"]
    bpb, _ = oracle.mean_and_error(small, held["windows"])
    top1, _ = oracle.mean_and_error(agree, held["windows"])
    assert 1.0 < bpb < 3.0 and top1 > 0.6, (bpb, top1)
    assert _problems(held, small, teacher, agree) == []


@needs_recorded_stdlib
def test_a_record_edited_by_a_plausible_amount_is_refused() -> None:
    """The tolerances are tight enough to matter: bits/byte 15% off, or agreement 0.05 off, fails."""
    held, small, teacher, agree = _heldout()
    bpb, top1 = held["bits_per_byte"], held["top1_agreement_with_teacher"]
    for wrong in (
        {"bits_per_byte": bpb * 0.85},
        {"bits_per_byte": bpb * 1.15},
        {"top1_agreement_with_teacher": top1 - 0.05},
        {"top1_agreement_with_teacher": top1 + 0.05},
    ):
        assert _problems({**held, **wrong}, small, teacher, agree), wrong
    for right in ({"bits_per_byte": round(bpb, 2)}, {"top1_agreement_with_teacher": round(top1, 2)}):
        assert _problems({**held, **right}, small, teacher, agree) == [], right


def test_a_small_draft_model_for_trained() -> None:
    small, big = trained_small_config(), trained_config()
    assert small.vocab_size == big.vocab_size == 256
    ratio = load_target("trained-small").parameter_bytes()["dense"] / load_target("trained").parameter_bytes()["dense"]
    assert ratio < 0.2  # a draft forward reads under a fifth of a target step's weight bytes
    assert {"conv", "attn"} <= set(small.layers)  # KV and conv state: both must be rolled back


def test_only_max_context_can_be_overridden() -> None:
    assert load_target("trained-small:max_context=256").max_context == 256
    with pytest.raises(PluginError, match="only max_context"):
        load_target("trained-small:d_model=8")
    with pytest.raises(InvalidSettingError):
        load_trained_small_target(3)  # type: ignore[arg-type]


def test_drafts_losslessly_and_beats_prompt_lookup_on_a_run() -> None:
    """On whitespace after a paragraph the trained model emits a run; lookup drafts one byte of it."""
    prompt = list(b"The quick brown fox jumps over the lazy dog.\n\nA new paragraph:\n")
    n = 48
    greedy = greedy_decode(load_target("trained"), prompt, n).tokens
    model = SpecDecoder(load_target("trained"), ModelDrafter(load_target("trained-small")), k=4).generate(prompt, n)
    lookup = SpecDecoder(load_target("trained"), NgramDrafter(), k=4).generate(prompt, n)
    assert model.tokens == lookup.tokens == greedy
    assert model.stats.mean_tokens_per_round > lookup.stats.mean_tokens_per_round


def test_generate_with_the_draft_model_equals_greedy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--target", "trained", "--drafter", "model:trained-small", "--compare-greedy", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["equal_to_greedy"] is True
    assert "ModelDrafter(trained-small)" in out["drafter"]
    assert np.isfinite(out["tokens_per_round"]) and out["tokens_per_round"] > 1.0
