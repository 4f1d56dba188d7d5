"""A failure's reproduce line reproduces it, also when the failure came from the example database.

A seeded run (a campaign round) that fails only because the database handed it an example its
seed does not draw — another worker's find, or another check's saved failure — must say so: its
reproduce line names the database (``--db``), and pasted, it fails again. "Nondeterministic" is
said only when the very example that failed passes when run again.

The subjects are written here: a drafter whose draft is one token too long, and an engine that
drops the last token of a generation, each for about one context (prompt) in 40 — found by some
seeds and missed by others (which ones depends on the Hypothesis version: they are searched for,
never written down).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import specproof
from specproof.cli import main
from specproof.conformance import certify

pytestmark = pytest.mark.slow  # real certify runs and campaigns: outside `tox -e quick`, always in `tox`

SRC = str(Path(specproof.__file__).parent.parent)

PLUGIN = '''
import zlib


def _rare(tokens):
    return zlib.crc32(bytes(int(t) % 256 for t in tokens)) % 40 == 0


class RareTooLong:
    """Drafts the context's tail; for one context in about 40 the draft is one token too long."""

    def propose(self, context, k):
        draft = [int(t) for t in list(context)[-k:]] if k else []
        if k and _rare(context):
            draft.append(0)
        return draft


def drafter():
    return RareTooLong()


def engine():
    """A correct speculative engine that drops the last token of one generation in about 40."""
    import attrs

    from specproof.conformance.zoo import zoo_engine

    made = zoo_engine()
    generate = made.generate

    def rare_generate(prompt, max_new_tokens, *, eos_token_id=None):
        out = generate(prompt, max_new_tokens, eos_token_id=eos_token_id)
        if len(out.tokens) > 1 and _rare(prompt):
            out = attrs.evolve(out, tokens=list(out.tokens)[:-1])
        return out

    made.generate = rare_generate
    return made
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The subjects' module (``rare_subjects``), importable here and in the processes the tests start."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "rare_subjects.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _seeds(finds: list[bool]) -> tuple[int, int]:
    """A seed (1-based) whose search finds the bug by itself, and one whose search does not."""
    found = [s for s, f in enumerate(finds, 1) if f]
    missed = [s for s, f in enumerate(finds, 1) if not f]
    if not found or not missed:
        pytest.skip(f"seeds 1..{len(finds)} all {'find' if found else 'miss'} the rare bug under this Hypothesis")
    return found[0], missed[0]


def _search(fails: object, limit: int = 40) -> tuple[int, int]:
    finds: list[bool] = []
    for seed in range(1, limit + 1):
        finds.append(bool(fails(seed)))  # type: ignore[operator]
        if any(finds) and not all(finds):
            break
    return _seeds(finds)


def test_a_find_replayed_from_another_invariants_namespace_reproduces(plugin: Path, tmp_path: Path) -> None:
    """``engine.stop``'s saved failure, replayed into the case's search, fails ``trace.consistency`` too:
    that check is shrunk from the very example (not "nondeterministic") and its line names the database."""
    spec, db = "rare_subjects:engine", tmp_path / "db"
    both = ("engine.stop", "trace.consistency")
    find, miss = _search(lambda s: certify("engine", engine=spec, only=both, seed=s, db="none").verdict == "fail")
    assert certify("engine", engine=spec, only=("engine.stop",), seed=find, db=str(db)).verdict == "fail"
    report = certify("engine", engine=spec, only=both, seed=miss, db=str(db))
    trace = next(r for r in report.results if r["invariant"] == "trace.consistency")
    assert trace["status"] == "fail", trace
    assert "nondeterministic" not in json.dumps(trace["violations"]), trace["detail"]
    assert f"--db {db}" in trace["reproduce"] and f"--seed {miss}" in trace["reproduce"], trace["reproduce"]
    assert main(shlex.split(trace["reproduce"])[1:]) == 1  # pasted, it fails again


def _run(args: list[str], *, tmp_path: Path, plugin: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECPROOF_HYPOTHESIS_DIR": str(tmp_path / "hyp"), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([SRC, str(plugin), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "specproof", *args], env=env, capture_output=True, text=True, timeout=600
    )


def test_a_campaign_find_replayed_by_another_worker_reproduces_when_pasted(plugin: Path, tmp_path: Path) -> None:
    """Worker A (seed that finds it) saves the find; worker B (a seed that misses it) replays it from the
    shared database and fails: B's printed reproduce line, pasted into a shell, fails again."""
    spec, only = "rare_subjects:drafter", ("drafter.max-length",)
    find, miss = _search(lambda s: certify("drafter", drafter=spec, only=only, seed=s, db="none").verdict == "fail")
    db, report = tmp_path / "db", tmp_path / "r.json"
    fuzz = ["fuzz", "drafter", "--drafter", spec, "--only", *only, "--workers", "1", "--db", str(db)]
    fuzz += ["--max-failures", "1", "--rounds", "1", "--report", str(report)]  # the seed's own round: any load
    first = _run([*fuzz, "--seed", str(find)], tmp_path=tmp_path, plugin=plugin)
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    second = _run([*fuzz, "--seed", str(miss)], tmp_path=tmp_path, plugin=plugin)
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    failure = json.loads(report.read_text())["campaign"]["failures"][0]
    line = failure["reproduce"]
    assert f"reproduce: {line}" in second.stdout  # the line the campaign printed
    assert f"--seed {miss}" in line and f"--db {db}" in line, line  # the seed alone passes: it names the database
    words = shlex.split(line)
    assert words[:2] == ["specproof", "certify"], line
    pasted = _run(words[1:], tmp_path=tmp_path, plugin=plugin)
    assert pasted.returncode == 1, pasted.stdout[-3000:] + pasted.stderr[-3000:]
