"""The ``trained-small`` draft model: it loads, matches its record, drafts for ``trained`` losslessly."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import numpy as np
import pytest

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
    assert training["total_seconds"] <= 600  # the budget: at most 10 minutes on this machine
    assert training["command"].startswith("python scripts/train_draft.py")
    held = meta["heldout"]
    assert 1.0 < held["bits_per_byte"] < 3.0 and held["top1_agreement_with_teacher"] > 0.6
    assert meta["torch_vs_reference"]["same_greedy"] is True
    json.dumps(meta)


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
