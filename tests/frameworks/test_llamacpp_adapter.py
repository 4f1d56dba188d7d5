"""The ``llamacpp:`` spec without llama.cpp: option parsing, file checks and the errors a user sees first.

These run anywhere (no llama-cpp-python, no gguf: a missing package is simulated where a test needs
one absent); tests/frameworks/test_llamacpp_engine.py drives a real llama.cpp.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specproof.engine import InvalidSettingError, MissingDependencyError
from specproof.engine.adapters.llamacpp import (
    KV_TYPES,
    LlamaCppSettings,
    check_gguf_file,
    parse_llamacpp_spec,
    require_llama_cpp,
)
from specproof.plugins import PluginError, plugin_factory


def test_defaults_are_plain_greedy_per_call_with_a_float32_cache(tmp_path: Path) -> None:
    s = parse_llamacpp_spec(str(tmp_path / "m.gguf"))
    assert s == LlamaCppSettings(model_path=str(tmp_path / "m.gguf"))
    assert (s.lookup, s.n_rs_seq, s.reuse, s.n_ctx, s.threads, s.kv_type) == (0, 0, False, None, 1, "f32")
    assert s.short_name() == "llamacpp-greedy"
    assert KV_TYPES["f32"] == 0  # GGML_TYPE_F32


def test_options_pass_through(tmp_path: Path) -> None:
    s = parse_llamacpp_spec(
        f"{tmp_path}/m.gguf,speculative=lookup:4:3,n_rs_seq=8,reuse=1,n_ctx=256,threads=2,kv_type=f16,oracle=trained"
    )
    assert (s.lookup, s.max_ngram, s.n_rs_seq, s.reuse, s.n_ctx, s.threads, s.kv_type, s.oracle) == (
        4, 3, 8, True, 256, 2, "f16", "trained",
    )  # fmt: skip
    assert s.short_name() == "llamacpp-lookup4-rs8-reuse-kvf16"
    assert "lookup:4:3" in s.describe() and "n_rs_seq=8" in s.describe()
    assert parse_llamacpp_spec(f"{tmp_path}/m.gguf,speculative=lookup:2").max_ngram == 2  # the library's default
    assert parse_llamacpp_spec(f"{tmp_path}/m.gguf,speculative=lookup:2,speculative=none").lookup == 0


def test_parallel_names_the_sequence_slots_and_is_left_out_of_names_when_one(tmp_path: Path) -> None:
    one = parse_llamacpp_spec(f"{tmp_path}/m.gguf,speculative=lookup:4,n_rs_seq=4")
    assert one.parallel == 1 and "parallel" not in one.describe() and "par" not in one.short_name()
    four = parse_llamacpp_spec(f"{tmp_path}/m.gguf,speculative=lookup:4,n_rs_seq=4,parallel=4")
    assert four.parallel == 4
    assert four.short_name() == "llamacpp-lookup4-rs4-par4"
    assert four.describe().endswith(",parallel=4]")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("speculative=lookup", "expected none or lookup:K"),
        ("speculative=ngram:4", "expected none or lookup:K"),
        ("speculative=lookup:0", "K must be >= 1"),
        ("speculative=lookup:4:0", "NGRAM must be >= 1"),
        ("speculative=lookup:x", "expected none or lookup:K"),
        ("n_rs_seq=-1", "n_rs_seq='-1': expected an integer >= 0"),
        ("n_rs_seq=many", "n_rs_seq='many'"),
        ("reuse=maybe", "reuse='maybe': expected 0 or 1"),
        ("n_ctx=1", "n_ctx='1': expected an integer >= 2"),
        ("threads=0", "threads='0'"),
        ("kv_type=q8_0", "kv_type='q8_0': expected f32 or f16"),
        ("parallel=0", "parallel='0': expected an integer >= 1"),
        ("parallel=two", "parallel='two'"),
        ("parallel=257", "parallel='257': at most 256 sequences"),
        (
            "speculative=lookup:4,parallel=200",
            "parallel=200: rows of up to K\\+1=5 judged tokens each exceed one "
            "llama_decode \\(n_batch=512\\); give at most parallel=102",
        ),
        ("colour=red", "'colour' is unknown"),
        ("reuse", "expected OPTION=VALUE"),
    ],
)
def test_bad_options_are_one_line_errors_naming_the_option(tmp_path: Path, options: str, message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message) as info:
        parse_llamacpp_spec(f"{tmp_path}/m.gguf,{options}")
    assert "\n" not in str(info.value)


def test_an_empty_spec_says_what_is_expected() -> None:
    with pytest.raises(InvalidSettingError, match=r"llamacpp:FILE.*specproof export gguf"):
        parse_llamacpp_spec("")


def test_files_that_are_no_gguf_are_refused_naming_the_export(tmp_path: Path) -> None:
    with pytest.raises(InvalidSettingError, match=r"no such file.*specproof export gguf"):
        check_gguf_file(str(tmp_path / "missing.gguf"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidSettingError, match=r"not a GGUF file .*specproof export gguf"):
        check_gguf_file(str(tmp_path / "config.json"))


def test_a_bad_spec_fails_before_anything_loads(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match=r"--engine 'llamacpp:.*no such file"):
        plugin_factory(f"llamacpp:{tmp_path}/none.gguf", kind="engine")
    with pytest.raises(PluginError, match="'colour' is unknown"):
        plugin_factory(f"llamacpp:{tmp_path}/none.gguf,colour=red", kind="engine")


def test_a_missing_llama_cpp_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'specproof\[llamacpp\]'"):
        require_llama_cpp()


@pytest.mark.parametrize("missing", ["llama_cpp", "gguf"])
def test_the_command_line_names_the_extra_when_a_package_is_missing(tmp_path: Path, missing: str) -> None:
    fake = tmp_path / "model.gguf"
    if missing == "gguf":
        fake.write_bytes(b"GGUF" + bytes(60))  # passes the magic check; reading it needs gguf
    else:
        pytest.importorskip("gguf", reason="writing the GGUF file llama_cpp would load needs the gguf package")
        from specproof.engine.targets.lfm2_gguf import save_lfm2_gguf
        from specproof.fixtures import load_trained_target

        save_lfm2_gguf(load_trained_target(), fake, source="trained")
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "from specproof.cli import main\n"
        f"sys.exit(main(['certify', 'engine', '--engine', 'llamacpp:{fake},oracle=trained', '--db', 'none']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "specproof[llamacpp]" in line and "Traceback" not in done.stderr, done.stderr


# --------------------------------------------------------------------------- the capacity agrees with the oracle's


class _Oracle:
    vocab_size = 256

    def __init__(self, max_context: object) -> None:
        self.max_context = max_context


def test_n_ctx_defaults_to_the_oracles_capacity_and_may_name_it(tmp_path: Path) -> None:
    from specproof.engine.adapters.llamacpp import resolve_n_ctx

    assert resolve_n_ctx(parse_llamacpp_spec(f"{tmp_path}/m.gguf"), _Oracle(4096)) == 4096
    assert resolve_n_ctx(parse_llamacpp_spec(f"{tmp_path}/m.gguf,n_ctx=4097"), _Oracle(4096)) == 4096


@pytest.mark.parametrize("n_ctx", [1024, 4096, 8192])
def test_an_n_ctx_unlike_the_oracles_capacity_is_refused_naming_both_ways_out(tmp_path: Path, n_ctx: int) -> None:
    from specproof.engine.adapters.llamacpp import resolve_n_ctx

    with pytest.raises(InvalidSettingError) as info:
        resolve_n_ctx(parse_llamacpp_spec(f"{tmp_path}/m.gguf,n_ctx={n_ctx}"), _Oracle(4096))
    assert str(info.value) == (
        f"llamacpp option n_ctx={n_ctx}: the engine would hold {n_ctx - 1} tokens but its oracle holds 4096, so "
        "plain greedy would not stop where llama.cpp does; drop n_ctx (default 4097) or name an oracle of that "
        f"capacity: oracle=TARGET:max_context={n_ctx - 1}"
    )
    with pytest.raises(InvalidSettingError, match="the oracle states no max_context"):
        resolve_n_ctx(parse_llamacpp_spec(f"{tmp_path}/m.gguf"), _Oracle(None))


def test_the_engine_refuses_the_capacity_before_llama_cpp_loads(tmp_path: Path, monkeypatch) -> None:
    from specproof.engine.adapters import llamacpp as adapter

    def not_here() -> None:
        raise AssertionError("llama.cpp was loaded before the capacity was checked")

    monkeypatch.setattr(adapter, "require_llama_cpp", not_here)
    with pytest.raises(InvalidSettingError, match=r"n_ctx=1024: the engine would hold 1023"):
        adapter.LlamaCppEngine(parse_llamacpp_spec(f"{tmp_path}/m.gguf,n_ctx=1024"), oracle=_Oracle(4096))


def test_the_cli_refuses_the_capacity_as_a_usage_error_before_any_work(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from specproof.engine.targets.lfm2_gguf import save_lfm2_gguf
    from specproof.fixtures import load_trained_target

    model = save_lfm2_gguf(load_trained_target(), tmp_path / "trained.gguf", source="trained")
    done = subprocess.run(
        [sys.executable, "-m", "specproof", "certify", "engine", "--engine", f"llamacpp:{model},n_ctx=1024",
         "--profile", "quick", "--db", "none"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "n_ctx=1024: the engine would hold 1023 tokens but its oracle holds 4096" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- sampled decoding, mapped


@pytest.mark.parametrize(
    ("params", "temp", "divides_by"),
    [
        ({"temperature": 0.0}, 0.0, None),  # greedy: llama.cpp's greedy sampler
        ({"temperature": 0.8, "top_k": 1}, 0.0, None),  # top_k=1 is greedy too (the contract's rule 1)
        ({"temperature": 0.8, "top_k": 5}, 0.8, None),  # top-k commutes with the temperature
        ({"temperature": 1.0, "top_p": 0.9, "min_p": 0.1}, 1.0, None),  # temperature 1: any order
        ({"temperature": 0.8, "top_p": 0.95}, 1.0, 0.8),  # top-p after the temperature: the adapter divides
        ({"temperature": 2.0, "min_p": 0.05}, 1.0, 2.0),
    ],
)
def test_sampling_maps_onto_llama_cpps_chain_in_the_contracts_order(
    params: dict, temp: float, divides_by: float | None
) -> None:
    import numpy as np

    from specproof.contract import SamplingParams, processed_distribution
    from specproof.engine.adapters.llamacpp import _sampling_kwargs

    sampling = SamplingParams(**params)
    kwargs = _sampling_kwargs(sampling)
    assert kwargs["temp"] == temp and kwargs["repeat_penalty"] == 1.0 and kwargs["typical_p"] == 1.0
    processors = kwargs.get("logits_processor")
    if divides_by is None:
        assert processors is None
        return
    (divide,) = processors
    logits = np.array([2.0, 1.5, 0.2, -1.0], dtype=np.float32)
    scaled = divide(np.zeros(0, dtype=np.intc), logits)
    np.testing.assert_allclose(scaled, logits / divides_by, rtol=1e-6)
    # llama.cpp's chain on the divided logits at temperature 1 (top-k, top-p, min-p) is the contract's p
    chain = SamplingParams(temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p)
    np.testing.assert_allclose(
        processed_distribution(scaled.astype(np.float64), chain), processed_distribution(logits, sampling), atol=1e-6
    )
