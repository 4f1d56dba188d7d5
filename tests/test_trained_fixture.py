"""The ``trained`` fixture: it loads, matches its metadata, is exactly batch-invariant and behaves like an LM.

Its record's figures (probe logits, greedy agreement, held-out bits per byte) are recomputed by
``tests/_hybrid_oracle.py``, an independent numpy copy of the model and of the held-out split:
neither the package's loader and ``ReferenceHybrid`` nor the training script's torch model.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _hybrid_oracle as oracle
from specproof.engine import InvalidSettingError, PluginError, ReferenceHybrid, greedy_decode
from specproof.fixtures import (
    FixtureDataError,
    _trained,
    load_trained_target,
    load_trained_weights,
    trained_config,
    trained_metadata,
)
from specproof.plugins import load_target

CODE_PROMPT = b"import os\n\n\ndef read_lines(path):\n    with open(path) as f:\n"
OTHER_PROMPT = b'class Queue:\n    """A FIFO queue."""\n\n    def __init__(self):\n'


@pytest.fixture(scope="module")
def target() -> ReferenceHybrid:
    return load_trained_target()


def test_loads_as_a_reference_hybrid_with_the_metadata_config(target: ReferenceHybrid) -> None:
    meta = trained_metadata()
    cfg = trained_config()
    assert target.config == cfg
    for name, value in meta["config"].items():
        got = getattr(cfg, name)
        assert (list(got) if name == "layers" else got) == value, name
    weights = load_trained_weights()
    assert set(weights) == set(ReferenceHybrid(cfg).weights)  # the names and count the architecture needs
    assert all(w.dtype == np.float32 and not w.flags.writeable for w in weights.values())
    assert sum(w.size for w in weights.values()) == meta["weights"]["parameters"]
    blob = resources.files("specproof.fixtures").joinpath("data", "trained.npz").read_bytes()
    assert len(blob) == meta["weights"]["bytes"] <= 8 * 1024 * 1024
    assert hashlib.sha256(blob).hexdigest() == meta["weights"]["sha256"]
    assert "gdn" not in cfg.layers  # a plain LFM2 layout, so the MLX / transformers converters take it


@pytest.fixture(scope="module")
def independent() -> oracle.OracleLM:
    record = oracle.load_record("trained")
    return oracle.OracleLM(record["config"], oracle.packaged_weights("trained"))


PROBES = [p["prompt"].encode() for p in oracle.load_record("trained")["probe"]]


@pytest.mark.parametrize("prompt", [*PROBES, CODE_PROMPT], ids=lambda p: repr(p[:20]))
def test_logits_match_an_independent_forward_pass(
    target: ReferenceHybrid, independent: oracle.OracleLM, prompt: bytes
) -> None:
    """The loader and ``ReferenceHybrid`` against the oracle, at every position (measured: 7e-6 apart)."""
    target.reset()
    np.testing.assert_allclose(target.forward(list(prompt)), independent.logits(list(prompt)), rtol=0, atol=1e-4)


def test_the_logit_comparison_rejects_a_wrong_model_and_accepts_float32(target: ReferenceHybrid) -> None:
    """The 1e-4 comparison can fail: the first conv's taps 0.05 off break it; float32 arithmetic does not."""
    record = oracle.load_record("trained")
    weights = oracle.packaged_weights("trained")
    broken = {**weights, "model.layers.0.conv.conv.weight": weights["model.layers.0.conv.conv.weight"] + 0.05}
    target.reset()
    ours = target.forward(list(CODE_PROMPT))
    assert np.abs(ours - oracle.OracleLM(record["config"], broken).logits(list(CODE_PROMPT))).max() > 1e-2
    np.testing.assert_allclose(
        ours, oracle.OracleLM(record["config"], weights, np.float32).logits(list(CODE_PROMPT)), rtol=0, atol=1e-4
    )


def test_the_recorded_probe_rows_are_what_the_weights_compute(independent: oracle.OracleLM) -> None:
    """The record's probe rows (torch's logits at export) against the oracle: the record is judged too."""
    probes = trained_metadata()["probe"]
    assert len(probes) == len(PROBES) >= 3
    for probe in probes:
        row = independent.logits(list(probe["prompt"].encode()))[-1]
        assert int(np.argmax(row)) == probe["argmax"], probe["prompt"]
        # the record rounds to 5 decimals and torch ran float32: measured 1.3e-5 apart
        np.testing.assert_allclose(row, np.array(probe["logits"]), rtol=0, atol=2e-4, err_msg=probe["prompt"])


def test_greedy_matches_the_independent_model(target: ReferenceHybrid, independent: oracle.OracleLM) -> None:
    """What the record's ``torch_vs_reference.same_greedy`` claims, recomputed against the oracle."""
    for prompt in PROBES:
        assert list(greedy_decode(target, list(prompt), 24).tokens) == independent.greedy(list(prompt), 24), prompt


@settings(max_examples=8)
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(CODE_PROMPT) - 1), max_size=5, unique=True))
def test_exactly_batch_invariant(target: ReferenceHybrid, cuts: list[int]) -> None:
    tokens = list(CODE_PROMPT)
    target.reset()
    whole = target.forward(tokens)
    target.reset()
    bounds = [0, *sorted(cuts), len(tokens)]
    pieces = np.concatenate([target.forward(tokens[a:b]) for a, b in itertools.pairwise(bounds)])
    assert whole.tobytes() == pieces.tobytes()  # bit for bit, whatever the chunking


def _printable_fraction(data: bytes) -> float:
    return sum(32 <= b < 127 or b in (9, 10) for b in data) / max(len(data), 1)


def test_greedy_code_continuation_is_text_and_depends_on_the_prompt(target: ReferenceHybrid) -> None:
    first = bytes(greedy_decode(target, list(CODE_PROMPT), 48).tokens)
    second = bytes(greedy_decode(target, list(OTHER_PROMPT), 48).tokens)
    assert _printable_fraction(first) >= 0.95, first
    assert _printable_fraction(second) >= 0.95, second
    assert first != second
    assert len(set(first)) > 4, first  # not one byte repeated: a trained model, not a degenerate one


def test_provenance_metadata_present() -> None:
    meta = trained_metadata()
    assert meta["heldout"]["files"] > 0 and meta["heldout"]["windows"] > 0
    # a plain range on every interpreter (the recomputation below needs the recorded standard library)
    assert 0.5 < meta["heldout"]["bits_per_byte"] < 3.5
    training = meta["training"]
    for key in ("seed", "steps", "threads", "budget_minutes", "train_seconds", "script_sha256", "command"):
        assert key in training, key
    assert training["steps"] > 0
    assert "sha256" in meta["data"]["split"]
    json.dumps(meta)  # plain JSON all the way down


needs_recorded_stdlib = pytest.mark.skipif(
    not oracle.same_stdlib(),
    reason="the held-out split is files of the CPython 3.11.7 standard library the records were measured on",
)


@needs_recorded_stdlib
def test_heldout_bits_per_byte_recomputed() -> None:
    """The held-out split and bits per byte, recomputed from the weights and the standard library."""
    meta = oracle.load_record("trained")
    text, files = oracle.heldout_text(meta["data"]["excluded_bench_files"])
    assert (files, len(text)) == (meta["heldout"]["files"], meta["data"]["heldout_bytes"])
    bits, _ = oracle.scored_sample("trained")
    mean, _ = oracle.mean_and_error(bits, meta["heldout"]["windows"])
    # 8 bits is chance and a byte-unigram model of Python source is about 5; a trained model is far below
    assert 0.5 < mean < 3.5, mean
    problem = oracle.judge_figure(meta["heldout"]["bits_per_byte"], bits, meta["heldout"]["windows"], "bits/byte")
    assert problem is None, problem


@needs_recorded_stdlib
def test_a_record_off_by_a_quarter_is_refused() -> None:
    """The tolerance is tight enough to matter: the recorded figure 25% off either way fails."""
    meta = oracle.load_record("trained")
    bits, _ = oracle.scored_sample("trained")
    recorded, population = meta["heldout"]["bits_per_byte"], meta["heldout"]["windows"]
    for wrong in (recorded * 0.75, recorded * 1.25, oracle.load_record("trained-small")["heldout"]["bits_per_byte"]):
        assert oracle.judge_figure(wrong, bits, population, "bits/byte") is not None, wrong
    for right in (round(recorded, 2), recorded + 0.01):  # rounded or measured in float32: accepted
        assert oracle.judge_figure(right, bits, population, "bits/byte") is None, right


def test_spec_overrides(target: ReferenceHybrid) -> None:
    small = load_trained_target("max_context=300")
    assert small.max_context == 300
    small.reset()
    target.reset()
    assert small.forward(list(CODE_PROMPT)).tobytes() == target.forward(list(CODE_PROMPT)).tobytes()
    with pytest.raises(InvalidSettingError, match=r"cannot override 'd_model=32'.*only max_context"):
        load_trained_target("d_model=32")


def test_target_spec_trained() -> None:
    assert isinstance(load_target("trained"), ReferenceHybrid)
    assert load_target("trained:max_context=512").max_context == 512
    with pytest.raises(PluginError, match=r"--target 'trained:n_heads=2'.*cannot override"):
        load_target("trained:n_heads=2")


def test_weights_that_do_not_match_their_metadata_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _trained._data_bytes

    def tampered(name: str) -> bytes:
        blob = real(name)
        return blob + b"\0" if name.endswith(".npz") else blob

    _trained.TRAINED.clear_cache()
    monkeypatch.setattr(_trained, "_data_bytes", tampered)
    try:
        with pytest.raises(FixtureDataError, match="different training runs"):
            load_trained_weights()
    finally:
        monkeypatch.undo()
        _trained.TRAINED.clear_cache()
    assert load_trained_weights()  # the untouched file still loads


# Passages written for this test, so no training run has seen them: held out by construction.
COPY_PASSAGES = (
    b"def merge_intervals(spans):\n    spans = sorted(spans)\n    out = [list(spans[0])]\n"
    b"    for lo, hi in spans[1:]:\n        if lo <= out[-1][1]:\n",
    b"The lighthouse keeper wrote every evening: wind from the north-west, three ships at anchor, "
    b"lamp trimmed at nine, oil low.",
)


def _copy_bits_per_byte(target: ReferenceHybrid, passage: bytes) -> tuple[float, float]:
    """Bits/byte of the first and of the second copy in ``passage + blank line + passage``."""
    tokens = list(passage + b"\n\n" + passage)
    target.reset()
    logits = target.forward(tokens[:-1]).astype(np.float64)
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    nll = -logp[np.arange(len(tokens) - 1), tokens[1:]]  # nll[i] scores byte i + 1
    n, second = len(passage), len(passage) + 2
    # each copy's first byte is left out: nothing before the first copy predicts it
    return float(nll[: n - 1].mean() / np.log(2)), float(nll[second : second + n - 1].mean() / np.log(2))


@pytest.mark.parametrize("passage", COPY_PASSAGES, ids=("code", "prose"))
def test_copies_a_passage_from_its_context(target: ReferenceHybrid, passage: bytes) -> None:
    """An induction head: the second copy of an unseen passage is far cheaper than the first."""
    first, second = _copy_bits_per_byte(target, passage)
    assert first > 1.0, first  # the passage is not something the model predicts without context
    assert second < 0.45 * first, (first, second)


# Measured: 33 of 48 bytes right on the committed fixture; 9 on the one before (256-byte windows, 3000 steps).
QUOTE_BYTES_RIGHT = 24
QUOTED = (
    b"Every evening the keeper logged the wind, the ships at anchor and the oil left in the lamp; "
    b"on stormy nights he logged them twice."
)


def test_greedy_quotes_an_unseen_passage(target: ReferenceHybrid) -> None:
    """Greedy decoding copies a passage the prompt asks it to quote (the behaviour prompt lookup relies on)."""
    opening = QUOTED[:24]
    prompt = QUOTED + b'\n\nQuote the passage above:\n"' + opening
    got = bytes(greedy_decode(target, list(prompt), 48).tokens)
    want = QUOTED[len(opening) : len(opening) + 48]
    right = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    assert right >= QUOTE_BYTES_RIGHT, (got, want)


def test_cli_generate_json_has_the_decoded_text(capsys: pytest.CaptureFixture[str]) -> None:
    from specproof import cli

    assert cli.main(["generate", "--target", "trained", "--max-new-tokens", "16", "--json", "def f(x):\n"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["tokens"]) == 16
    assert data["text"] == bytes(data["tokens"]).decode("utf-8", errors="backslashreplace")


def test_cli_generate_prompt_file_and_workload(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    from pathlib import Path

    from specproof import cli
    from specproof.bench import build_workloads

    path = Path(str(tmp_path)) / "prompt.txt"
    path.write_bytes(b"def f(x):\n    return x\n\n\n")  # trailing newlines are part of the prompt
    assert cli.main(["generate", "--target", "trained", "--prompt-file", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == len(path.read_bytes())
    assert cli.main(["generate", "--target", "trained", "--workload", "structured", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == len(build_workloads(["structured"])[0].text)

    bad = Path(str(tmp_path)) / "latin1.txt"
    bad.write_bytes(b"caf\xe9")
    for argv, message in (
        (["--prompt-file", str(bad)], "not UTF-8 text (byte 3 is 0xe9)"),
        (["--prompt-file", str(Path(str(tmp_path)) / "missing.txt")], "No such file"),
        (["--workload", "poetry"], "not a bench workload; choose one of code-edit"),
        (["hello", "--workload", "free-text"], "give one prompt, not a prompt text and --workload"),
    ):
        assert cli.main(["generate", "--target", "trained", *argv]) == 2
        assert message in capsys.readouterr().err, argv


def test_the_oracle_shares_no_code_with_what_it_judges() -> None:
    """``tests/_hybrid_oracle.py`` imports neither the package's model code nor the training scripts."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(oracle.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n.split(".")[0] in ("specproof", "train_fixture", "train_draft", "scripts")}
    assert names <= {
        "__future__",
        "functools",
        "hashlib",
        "json",
        "os",
        "sys",
        "sysconfig",
        "importlib",
        "pathlib",
        "typing",
        "numpy",
    }, names
