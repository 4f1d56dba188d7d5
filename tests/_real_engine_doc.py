"""docs/real-engines.md's quoted outputs, held to real runs.

Each failure block the page quotes is marked ``<!-- output: NAME ... -->`` before its fenced block. The
real-engine tests (tests/frameworks/test_vllm_engine.py, test_llamacpp_engine.py) run the certification
the block's ``reproduce`` line names, on a model written where the page says (``/tmp/vllm-trained``,
``/tmp/trained.gguf``: the derandomized examples depend on the engine spec, its path included), cut the
same block out of the run's screen output (``failure_block``) and compare: a stale quote fails with the
block to paste. tests/frameworks/test_real_engines_doc.py checks the marks without any engine.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "real-engines.md"

# where the page's commands put the models: the doc-output runs write them there too
VLLM_DOC_MODEL = Path("/tmp/vllm-trained")
LLAMACPP_DOC_MODEL = Path("/tmp/trained.gguf")

# a failing session's history is saved under Hypothesis' directory, which differs per user: the page quotes the
# default one (the user cache) as ``~``, and a run's own directory is read as that
QUOTED_HYPOTHESIS_HOME = "~/.cache/specproof/hypothesis"

_MARK = re.compile(r"^<!-- output: (?P<name>[\w-]+)[^\n]*-->\n```\n(?P<body>.*?)\n```$", re.M | re.S)


def quoted_outputs(text: str | None = None) -> dict[str, str]:
    """Every marked block of the page: name -> its text (between the fences)."""
    return {m["name"]: m["body"] for m in _MARK.finditer(DOC.read_text() if text is None else text)}


def failure_block(output: str, invariant: str) -> str:
    """The screen block that tells ``invariant``'s failure: its own (``──── INVARIANT (case) ────``), or the one
    shared failure that stopped it (``──── one failure stopped N checks ────``), without its header line,
    as the page quotes it."""
    blocks = re.split(r"^──── (.*) ────$", output, flags=re.M)
    # [before, header, body, header, body, ...]; the last body runs into the verdict line
    for header, body in zip(blocks[1::2], blocks[2::2]):
        body = body.split("\nverdict: ", 1)[0].strip("\n")
        own = header.startswith(f"{invariant} (")
        shared = header.startswith("one failure stopped") and re.search(
            rf"checks it stopped: .*\b{re.escape(invariant)}\b", body
        )
        if own or shared:
            return body
    raise AssertionError(f"no failure block for {invariant} in the output:\n{output[-4000:]}")


def check_quoted(name: str, output: str, invariant: str, *, hypothesis_dir: Path | None = None) -> None:
    """The page's block ``name`` is this run's block for ``invariant``; the message shows the block to paste.
    ``hypothesis_dir``: the run's Hypothesis directory, which the page writes as the default one."""
    want = quoted_outputs()[name]
    got = failure_block(output, invariant)
    if hypothesis_dir is not None:
        got = got.replace(f"{hypothesis_dir}/", f"{QUOTED_HYPOTHESIS_HOME}/")
    assert got == want, (
        f"docs/real-engines.md's quoted output {name!r} is stale; this run printed:\n```\n{got}\n```\n"
        f"(the page quotes:\n```\n{want}\n```)"
    )
