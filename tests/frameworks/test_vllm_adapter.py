"""The ``vllm:`` spec without vLLM: option parsing, checkpoint checks and the errors a user sees first.

These run anywhere (numpy only); tests/frameworks/test_vllm_engine.py drives a real vLLM.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from specproof.engine import InvalidSettingError
from specproof.engine.adapters.vllm import VLLMSettings, check_checkpoint, parse_vllm_spec
from specproof.engine.targets.convert import save_vllm_lfm2
from specproof.fixtures import load_trained_target


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_vllm_lfm2(load_trained_target(), str(tmp_path_factory.mktemp("vllm") / "trained"), source="trained")


def test_defaults_are_plain_greedy_with_the_rotary_workaround(checkpoint: Path) -> None:
    s = parse_vllm_spec(str(checkpoint))
    assert s == VLLMSettings(model_dir=str(checkpoint))
    assert s.max_model_len is None  # the oracle's capacity + 1, resolved by VLLMEngine (test_vllm_capacity.py)
    with pytest.raises(InvalidSettingError, match="max_model_len is unresolved"):
        s.llm_kwargs()
    kwargs = attrs.evolve(s, max_model_len=4097).llm_kwargs(max_positions=4096)
    assert kwargs["max_model_len"] == 4097 and kwargs["hf_overrides"] == {"max_position_embeddings": 4097}
    assert kwargs["skip_tokenizer_init"] is True and kwargs["dtype"] == "float32"
    assert kwargs["enable_prefix_caching"] is False and kwargs["enforce_eager"] is True
    assert kwargs["compilation_config"] == {"custom_ops": ["-rotary_embedding"]}
    assert "speculative_config" not in kwargs
    assert kwargs["logprobs_mode"] == "processed_logprobs"  # logprobs after the processors, as the contract
    assert s.short_name() == "vllm-greedy"


def test_ngram_options_pass_through(checkpoint: Path) -> None:
    s = parse_vllm_spec(f"{checkpoint},speculative=ngram:4:2:3,prefix_caching=1,rotary=kernel,eager=0,spec.foo=0.5")
    kwargs = attrs.evolve(s, max_model_len=64).llm_kwargs(max_positions=4096)
    assert kwargs["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 3,
        "foo": 0.5,
    }
    assert kwargs["enable_prefix_caching"] is True and kwargs["enforce_eager"] is False
    assert "compilation_config" not in kwargs and "hf_overrides" not in kwargs
    assert kwargs["per_request_spec_decode_metrics"] == "detailed"
    assert s.short_name() == "vllm-ngram4-prefix-caching-rotary-kernel-compiled"
    assert parse_vllm_spec(f"{checkpoint},speculative=ngram:2").speculative_config() == {
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
    }  # fmt: skip
    assert parse_vllm_spec(f"{checkpoint},speculative=suffix:3").speculative_config() == {
        "method": "suffix", "num_speculative_tokens": 3,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("speculative=ngram", "expected none, ngram:K"),
        ("speculative=ngram:0", "K must be >= 1"),
        ("speculative=ngram:4:3:2", "1 <= MIN <= MAX"),
        ("prefix_caching=maybe", "expected 0 or 1"),
        ("rotary=fast", "expected native"),
        ("max_model_len=1", "max_model_len"),
        ("max_num_seqs=0", "max_num_seqs"),
        ("kv_blocks=few", "kv_blocks='few': expected an integer >= 1"),
        ("colour=red", "'colour' is unknown"),
        ("spec.x=1", "set speculative=METHOD:K first"),
        ("eager", "expected OPTION=VALUE"),
    ],
)
def test_bad_options_are_one_line_errors(checkpoint: Path, options: str, message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        parse_vllm_spec(f"{checkpoint},{options}")


def test_checkpoints_vllm_cannot_load_are_refused_naming_the_export(tmp_path: Path) -> None:
    with pytest.raises(InvalidSettingError, match=r"no config\.json.*specproof export vllm"):
        check_checkpoint(str(tmp_path))
    base = {"model_type": "lfm2", "hidden_size": 96, "num_attention_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(base))
    with pytest.raises(InvalidSettingError, match="no conv_dim"):
        check_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**base, "conv_dim": 96}))
    with pytest.raises(InvalidSettingError, match=r"head size 24 .*--head-dim 32"):
        check_checkpoint(str(tmp_path))


def test_the_command_line_names_the_extra_when_vllm_is_missing(checkpoint: Path) -> None:
    try:
        import vllm  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("vLLM is importable here: the missing-package message cannot be shown")
    argv = [sys.executable, "-m", "specproof", "certify", "engine", "--engine", f"vllm:{checkpoint}", "--db", "none"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "specproof[vllm]" in line and "Traceback" not in done.stderr, done.stderr


def test_export_command_writes_a_checkpoint_the_spec_accepts(tmp_path: Path) -> None:
    out = tmp_path / "exported"
    done = subprocess.run(
        [sys.executable, "-m", "specproof", "export", "vllm", str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "heads 24 -> 32" in done.stdout
    assert check_checkpoint(str(out))["specproof"]["source"] == "trained"
    bad = subprocess.run(
        [sys.executable, "-m", "specproof", "export", "vllm", str(tmp_path / "x"), "--target", "reference"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr


class _Metrics:
    """vLLM's RequestSpecDecodeMetrics.to_dict() at the "detailed" level (vllm/v1/metrics/stats.py)."""

    def __init__(self, drafted: list[int], accepted: list[int]) -> None:
        self.drafted, self.accepted = drafted, accepted

    def to_dict(self) -> dict[str, object]:
        return {
            "num_draft_tokens": sum(self.drafted),
            "num_accepted_draft_tokens": sum(self.accepted),
            "per_step_drafted": self.drafted,
            "per_step_accepted": self.accepted,
        }


def test_stats_carry_the_acceptance_per_draft_position() -> None:
    from types import SimpleNamespace

    from specproof.engine.adapters.vllm import VLLMEngine

    # three verify steps: 4 drafted 2 kept, 4 drafted 4 kept, 1 drafted 0 kept
    completion = SimpleNamespace(spec_decode_metrics=_Metrics([4, 4, 1], [2, 4, 0]))
    stats = VLLMEngine._stats(None, completion, 9)  # type: ignore[arg-type]
    assert (stats.drafted, stats.accepted, stats.emitted) == (9, 6, 9)
    assert stats.position_attempts == (3, 2, 2, 2) and stats.position_accepts == (2, 2, 1, 1)
    assert sum(stats.position_attempts) == stats.drafted and sum(stats.position_accepts) == stats.accepted
    # no speculation: no metrics, no stats (the engine is certified as plain greedy)
    assert VLLMEngine._stats(None, SimpleNamespace(), 3) is None  # type: ignore[arg-type]
