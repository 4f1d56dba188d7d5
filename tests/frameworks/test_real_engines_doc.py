"""docs/real-engines.md against its sources, without vLLM or llama.cpp: the known-causes table rendered from
``specproof.engine.adapters.known_causes``, the quoted outputs marked for the real-run tests, the install
steps' constraints file and the environments' folders ignored by git; and the known-cause rows matched on
the adapters' settings."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from _real_engine_doc import DOC, check_quoted, failure_block, quoted_outputs
from specproof.engine.adapters.known_causes import KNOWN_CAUSES, known_cause, markdown_table
from specproof.engine.adapters.llamacpp import LlamaCppSettings
from specproof.engine.adapters.vllm import VLLMSettings

ROOT = Path(__file__).resolve().parents[2]
_SECTION = re.compile(r"<!-- known-causes: begin[^\n]*-->\n(?P<table>.*?)<!-- known-causes: end -->", re.S)


def known_causes_section(text: str) -> str:
    found = _SECTION.search(text)
    assert found is not None, "docs/real-engines.md has no known-causes section"
    return found["table"]


def test_the_doc_table_of_known_causes_is_the_codes() -> None:
    assert known_causes_section(DOC.read_text()) == markdown_table(), (
        "docs/real-engines.md's known-causes table differs from specproof.engine.adapters.known_causes: "
        "paste markdown_table() between its markers"
    )


def test_a_hand_edited_table_is_told_apart() -> None:
    text = DOC.read_text()
    edited = text.replace("`prefix_caching=0` (the default)", "`prefix_caching=1`", 1)
    assert known_causes_section(edited) != markdown_table()
    assert known_causes_section(text.replace("| vLLM finding 1 |", "| vLLM finding 1 |")) == markdown_table()


def _vllm(**fields: object) -> VLLMSettings:
    return VLLMSettings(model_dir="/m", **fields)  # type: ignore[arg-type]


def _llama(**fields: object) -> LlamaCppSettings:
    return LlamaCppSettings(model_path="/m.gguf", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "settings", "invariant", "finding"),
    [
        ("vllm", _vllm(method="ngram", num_speculative_tokens=4), "engine.lossless", "vLLM finding 1"),
        ("vllm", _vllm(method="ngram", num_speculative_tokens=4), "engine.sampled-support", "vLLM finding 1"),
        ("vllm", _vllm(method="ngram", num_speculative_tokens=4), "engine.stop", None),  # not a wrong-token check
        ("vllm", _vllm(method="ngram", num_speculative_tokens=4, prefix_caching=True), "engine.stop", "vLLM finding 3"),
        ("vllm", _vllm(rotary="kernel"), "engine.lossless", "vLLM finding 2"),
        ("vllm", _vllm(rotary="kernel", eager=False), "engine.lossless", None),  # compiled: the kernel is not used
        ("vllm", _vllm(), "engine.lossless", None),  # the defaults are lossless: a failure there is news
        ("llamacpp", _llama(lookup=4), "engine.lossless", "llama.cpp finding 1"),
        ("llamacpp", _llama(lookup=4, n_rs_seq=2), "engine.session", "llama.cpp finding 1"),
        ("llamacpp", _llama(lookup=4, n_rs_seq=4), "engine.lossless", None),
        ("llamacpp", _llama(lookup=4, n_rs_seq=4, reuse=True), "engine.session", "llama.cpp finding 2"),
        ("llamacpp", _llama(lookup=4, n_rs_seq=4, reuse=True), "engine.lossless", None),
        ("llamacpp", _llama(reuse=True), "engine.session", None),  # plain greedy with reuse passes
    ],
)
def test_known_causes_match_the_settings_they_name(
    engine: str, settings: object, invariant: str, finding: str | None
) -> None:
    row = known_cause(engine, settings, invariant)
    assert (row.finding if row is not None else None) == finding


def test_every_row_is_told_under_a_heading_of_the_page() -> None:
    text = DOC.read_text()
    vllm, _, llama = text.partition("## llama.cpp (through llama-cpp-python)")
    for row in KNOWN_CAUSES:
        number = row.finding.rsplit(" ", 1)[1]
        part = vllm if row.engine == "vllm" else llama
        assert re.search(rf"^#+ {number}\. ", part, re.M), row.finding


# --------------------------------------------------------------------------- the quoted outputs


def test_the_quoted_outputs_are_marked_and_carry_their_known_cause() -> None:
    # every block regenerated from a real run and held to it by the engine's own test file
    quoted = quoted_outputs()
    assert set(quoted) == {"vllm-ngram4", "llamacpp-lookup4", "llamacpp-reuse"}
    cases = {
        "vllm-ngram4": ("vllm", _vllm(method="ngram", num_speculative_tokens=4), "engine.lossless"),
        "llamacpp-lookup4": ("llamacpp", _llama(lookup=4), "engine.lossless"),
        "llamacpp-reuse": ("llamacpp", _llama(lookup=4, n_rs_seq=4, reuse=True), "engine.session"),
    }
    for name, (engine, settings, invariant) in cases.items():
        row = known_cause(engine, settings, invariant)
        assert row is not None
        block = quoted[name]
        assert row.sentence() in block, name
        # a run prints the tolerance in force and never elides: the quote is what a run printed
        assert "tie tolerance 0)" not in block and ",...]" not in block and " ...:" not in block, name
        model = "vllm:/tmp/vllm-trained," if engine == "vllm" else "llamacpp:/tmp/trained.gguf,"
        assert f"    reproduce: specproof certify engine --engine {model}" in block, name
        assert f"--only {invariant}" in block, name


SCREEN = """\
verdict line before
──── engine.lossless (c) ────
[engine.lossless]: token 1 differs
    minimal example: {"prompt": [0]}
    reproduce: specproof certify ...
──── one failure stopped 2 checks ────
the generation did not complete: boom
    checks it stopped: engine.stop, engine.session (c)
    reproduce: specproof certify ... --only engine.stop
verdict: FAIL (3 fail) in 1.0 s
"""


def test_failure_blocks_are_cut_from_the_screen() -> None:
    assert failure_block(SCREEN, "engine.lossless") == (
        '[engine.lossless]: token 1 differs\n    minimal example: {"prompt": [0]}\n    reproduce: specproof certify ...'
    )
    assert failure_block(SCREEN, "engine.session").startswith("the generation did not complete: boom\n")
    with pytest.raises(AssertionError, match=r"no failure block for engine\.cost"):
        failure_block(SCREEN, "engine.cost")


def test_a_stale_quote_fails_with_the_block_to_paste(monkeypatch: pytest.MonkeyPatch) -> None:
    import _real_engine_doc

    page = "<!-- output: x (a run) -->\n```\n[engine.lossless]: token 1 differs\n```\n"
    monkeypatch.setattr(_real_engine_doc, "quoted_outputs", lambda: quoted_outputs(page))
    screen = "──── engine.lossless (c) ────\n[engine.lossless]: token 1 differs\nverdict: FAIL\n"
    check_quoted("x", screen, "engine.lossless")  # the same: accepted
    with pytest.raises(
        AssertionError, match=r"quoted output 'x' is stale; this run printed:\n```\n\[engine.lossless\]: t"
    ):
        check_quoted("x", screen.replace("token 1", "token 2"), "engine.lossless")


def test_a_runs_hypothesis_directory_is_read_as_the_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    import _real_engine_doc

    line = "    reproduce: specproof certify ... --replay-session {}/sessions/session-0123456789ab.json"
    page = "<!-- output: s (a run) -->\n```\n" + line.format("~/.cache/specproof/hypothesis") + "\n```\n"
    monkeypatch.setattr(_real_engine_doc, "quoted_outputs", lambda: quoted_outputs(page))
    screen = "──── engine.session (c) ────\n" + line.format("/tmp/run/hyp") + "\nverdict: FAIL\n"
    check_quoted("s", screen, "engine.session", hypothesis_dir=Path("/tmp/run/hyp"))  # its own folder: accepted
    with pytest.raises(AssertionError, match="quoted output 's' is stale"):
        check_quoted("s", screen, "engine.session", hypothesis_dir=Path("/tmp/other"))  # another folder stays
    with pytest.raises(AssertionError, match="quoted output 's' is stale"):
        check_quoted(
            "s", screen.replace("0123456789ab", "ba9876543210"), "engine.session", hypothesis_dir=Path("/tmp/run/hyp")
        )


# --------------------------------------------------------------------------- install steps and folders


def test_install_steps_use_the_constraints_file() -> None:
    installs = [
        line for line in DOC.read_text().splitlines() if re.search(r"pip install [^`]*\.\[(vllm|llamacpp)\]", line)
    ]
    assert len(installs) >= 2, installs
    assert all("-c constraints.txt" in line for line in installs), installs
    assert "pip install -c constraints.txt 'specproof[llamacpp]'" in DOC.read_text()


def test_the_doc_environments_are_ignored_by_git() -> None:
    for folder in ("venv-vllm", "venv-llama"):
        done = subprocess.run(
            ["git", "check-ignore", "-q", f"{folder}/bin/python"], cwd=ROOT, capture_output=True, check=False
        )
        assert done.returncode == 0, f"{folder}/ is not ignored by git"
    assert subprocess.run(["git", "check-ignore", "-q", "docs/real-engines.md"], cwd=ROOT, check=False).returncode == 1
