"""The native C++ engine (native/) over specproof-engine/1: its forward against the numpy
``trained`` target, lossless rounds on both rollbacks with scripted suite drafts, sessions,
TCP, and every planted ``--bug`` caught.

The engine is built on first use (cmake, or g++ directly) out of the source tree; without a
C++ toolchain the tests skip and say so, and a build that fails with one present fails them.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _wire_helpers import Certified, certify_command, slow_certify
from specproof.bench._workloads import build_workloads, encode_text
from specproof.conformance import check_generation
from specproof.engine import Generation, NgramDrafter, greedy_decode
from specproof.engine.targets.reference import ReferenceHybrid
from specproof.plugins import load_target
from specproof.strategies import PlannedRound, RoundPlan, ScriptedDrafter, round_plans
from specproof.wire import EngineRequestError, ExecEngine, TcpEngine
from specproof.wire.native import (
    NativeBuildError,
    NativeToolchainError,
    build_native,
    export_weights,
    native_build_dir,
    native_dir,
)

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

LOGIT_ATOL = 1e-4  # measured: 1.5e-5 over 300 positions of a bench prompt
BUGS = (
    "stale-conv",
    "processed-off-by-one",
    "skip-restore-when-zero-accepted",
    "bonus-from-wrong-row",
    "prefix-reuse-stale-state",
    "tokens-after-eos",
    "old-kv-row",
    "never-reuses-prefix",
    "overclaims-prefix-reuse",
)


@pytest.fixture(scope="session")
def start(native: tuple[Path, Path]) -> Callable[..., ExecEngine]:
    binary, weights = native

    def make(*args: str, full_state: bool = False, state_mode: str | None = None) -> ExecEngine:
        return ExecEngine(
            [str(binary), "--weights", str(weights), *args],
            timeout=30.0,
            full_state=full_state,
            state_mode=state_mode,
            load_target=load_target,
        )

    return make


@pytest.fixture(scope="module", params=["checkpoint", "replay"])
def engine(request: pytest.FixtureRequest, start: Callable[..., ExecEngine]) -> Iterator[ExecEngine]:
    with start("--rollback", request.param) as e:
        yield e


_REFERENCE: dict[str, ReferenceHybrid] = {}


def reference(role: str = "greedy") -> ReferenceHybrid:
    """One numpy ``trained`` target per role (greedy oracle, state reference), reused."""
    if role not in _REFERENCE:
        target = load_target("trained")
        assert isinstance(target, ReferenceHybrid)
        _REFERENCE[role] = target
    return _REFERENCE[role]


def greedy(prompt: Sequence[int], n: int, eos: int | None = None) -> list[int]:
    return list(greedy_decode(reference(), prompt, n, eos_token_id=eos).tokens)


def bench_prompts() -> dict[str, list[int]]:
    return {w.name: encode_text(reference(), w.text) for w in build_workloads(prompt_chars=400)}


# --------------------------------------------------------------------------- the forward


Arrays = tuple[np.ndarray, np.ndarray]


def run_logits(native: tuple[Path, Path], tmp_path: Path, tokens: list[int], chunk: int) -> Arrays:
    """Logits ``[len(tokens), vocab]`` of the engine's forward in chunks of ``chunk``, and its flat state."""
    binary, weights = native
    (tmp_path / "in.json").write_text(json.dumps({"tokens": tokens, "chunk": chunk}))
    out = tmp_path / f"out{chunk}.f32"
    command = [binary, "--weights", weights, "--logits", tmp_path / "in.json", out]
    subprocess.run(command, check=True, capture_output=True)
    logits = np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)
    return logits, np.fromfile(str(out) + ".state", dtype=np.float32)


def test_logits_and_state_agree_with_the_numpy_target(native: tuple[Path, Path], tmp_path: Path) -> None:
    tokens = bench_prompts()["code-edit"][:300]
    got, state = run_logits(native, tmp_path, tokens, chunk=300)
    target = load_target("trained")
    want = target.forward(tokens)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < LOGIT_ATOL
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
    ref = target.state_arrays()  # type: ignore[attr-defined]
    flat = np.concatenate([ref[name].ravel() for name in ("key_cache", "value_cache", "conv_state", "rec_state")])
    assert state.shape == flat.shape and np.abs(state - flat).max() < LOGIT_ATOL
    # the C++ forward is exactly batch-invariant: one-token steps give the same bits
    one, _ = run_logits(native, tmp_path, tokens, chunk=1)
    assert one.tobytes() == got.tobytes()


def test_greedy_and_speculative_equal_numpy_greedy_on_the_bench_prompts(engine: ExecEngine) -> None:
    engine.drafter = None
    for name, prompt in bench_prompts().items():
        want = greedy(prompt, 48)
        assert engine.greedy(prompt, 48) == want, name
        engine.reset()
        gen = engine.generate(prompt, 48)
        assert list(gen.tokens) == want, name
        assert_clean(gen, prompt, engine, 48)
        assert gen.stats is not None and gen.stats.accepted > 0, name  # the n-gram drafter was used
        engine.reset()


def test_handshake(engine: ExecEngine) -> None:
    assert engine.engine_name == "specproof-native"
    assert engine.vocab_size == 256 and engine.k == 4 and engine.max_context == 4096
    assert engine.capabilities == {
        "greedy",
        "suite_drafts",
        "state",
        "sessions",
        "state_delta",
        "state_digest",
        "sampling",
        "seeded",
        "batched",
        "trees",
        "tree_state",
        "sampled_trees",
        "penalties",
        "logit_bias",
        "bad_words",
        "min_tokens",
        "stop_sequences",
        "logprobs",
        "processor_state",
    }
    assert engine.sampling_schemes == ("rejection", "match")  # --scheme rejection, the default, first
    assert engine.state_kind() == "digests"  # the default where the engine offers them
    assert engine.model == "trained" and isinstance(engine.oracle, ReferenceHybrid)
    assert 0 < engine.atol <= 1e-3 and engine.tie_tolerance > 0
    assert "specproof-engine" in engine.stderr_tail


# --------------------------------------------------------------------------- rounds with suite drafts


def assert_clean(gen: Generation, prompt: Sequence[int], engine: ExecEngine, n: int, eos: int | None = None) -> None:
    results = check_generation(
        gen,
        prompt=prompt,
        k=engine.k,
        max_new_tokens=n,
        eos_token_id=eos,
        max_context=engine.max_context,
        rollback=engine.rollback,
        final_processed=engine.target.processed,
    )
    assert {k: v for k, v in results.items() if v} == {}


class StateChecking:
    """Wraps a drafter: at every proposal compares the engine's reported state with a fresh
    reference fed ``ctx[:-1]`` (the previous round's rollback is done by then)."""

    def __init__(self, inner: object, engine: ExecEngine) -> None:
        self.inner = inner
        self.engine = engine
        self.problems: list[str] = []
        self.checks = 0

    def reset(self) -> None:
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()

    def check(self, context: Sequence[int], when: str) -> None:
        view = self.engine.target
        if view.processed != len(context) - 1:
            self.problems.append(f"{when}: processed {view.processed} != len(ctx) - 1 = {len(context) - 1}")
            return
        ref = reference("state")
        ref.reset()
        if len(context) > 1:
            ref.forward(list(context[:-1]))
        self.checks += 1
        # the view compares itself: whole arrays element-wise, digests by projection, a CRC-32 chain
        if why := view.state_differs(ref.state_arrays(), atol=self.engine.atol):
            self.problems.append(f"{when}: {why}")

    def propose(self, context: Sequence[int], k: int) -> Sequence[int]:
        self.check(context, f"round at context length {len(context)}")
        return self.inner.propose(context, k)  # type: ignore[attr-defined,no-any-return]


PROMPTS = [list(b"def indent(text, prefix):\n    return "), list(b"The quick brown fox"), [10]]


@settings(max_examples=10)
@given(
    prompt=st.sampled_from(PROMPTS),
    plan=round_plans(k=4, max_rounds=6),
    n=st.integers(1, 24),
    use_eos=st.booleans(),
)
def test_scripted_rounds_are_lossless_with_the_state_restored(
    engine: ExecEngine, prompt: list[int], plan: RoundPlan, n: int, use_eos: bool
) -> None:
    want_full = greedy(prompt, n)
    eos = want_full[len(want_full) // 2] if use_eos else None
    want = greedy(prompt, n, eos)
    scripted = ScriptedDrafter(prompt, want_full, plan, vocab_size=256)
    probe = StateChecking(scripted, engine)
    engine.reset()
    engine.drafter = probe
    try:
        gen = engine.generate(prompt, n, eos_token_id=eos)
    finally:
        engine.drafter = None
    assert list(gen.tokens) == want
    assert_clean(gen, prompt, engine, n, eos)
    probe.check([*prompt, *gen.tokens], "after the generation")
    assert probe.problems == []


def test_sessions_reuse_the_prefix_and_stay_lossless(engine: ExecEngine) -> None:
    engine.reset()
    engine.drafter = None
    prompt = bench_prompts()["structured"]
    first = engine.generate(prompt, 16)
    assert first.stats is not None and first.stats.prefill_forwards == 1
    # the next turn: the whole previous context plus a user message
    turn = [*prompt, *first.tokens, *b"\nnext: "]
    second = engine.generate(turn, 16)
    assert list(second.tokens) == greedy(turn, 16)
    # regenerate with an edited tail: the shared prefix ends before the kept snapshots
    edited = [*prompt[:-30], *b"# edited\n"]
    third = engine.generate(edited, 16)
    assert list(third.tokens) == greedy(edited, 16)
    probe = StateChecking(NgramDrafter(), engine)
    probe.check([*edited, *third.tokens], "after the edited request")
    assert probe.problems == []


def test_a_drafter_that_raises_leaves_the_engine_usable(engine: ExecEngine) -> None:
    class Broken:
        def propose(self, context: Sequence[int], k: int) -> list[int]:
            raise RuntimeError("drafter exploded")

    engine.reset()
    engine.drafter = Broken()
    try:
        with pytest.raises(RuntimeError, match="drafter exploded"):
            engine.generate(PROMPTS[0], 8)
    finally:
        engine.drafter = None
    assert engine.greedy(PROMPTS[0], 8) == greedy(PROMPTS[0], 8)


def test_tcp_listen(native: tuple[Path, Path]) -> None:
    binary, weights = native
    proc = subprocess.Popen(
        [binary, "--weights", weights, "--listen", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        with TcpEngine("127.0.0.1", port, timeout=30.0, load_target=load_target) as engine:
            prompt = PROMPTS[1]
            gen = engine.generate(prompt, 20)
            assert list(gen.tokens) == greedy(prompt, 20)
            assert engine.target.processed == len(prompt) + 19
        assert proc.poll() is None  # close() only disconnected: the engine listens for the next session
        engine = TcpEngine("127.0.0.1", port, timeout=30.0, load_target=load_target)
        assert engine.greedy(PROMPTS[0], 5) == greedy(PROMPTS[0], 5)
        engine.shutdown()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- planted bugs


def findings(engine: ExecEngine) -> list[str]:
    """Run scenarios that reach every rollback path; every way the run went wrong."""
    found: list[str] = []
    prompt = PROMPTS[0]
    n = 20
    full = greedy(prompt, n)
    plans = [
        RoundPlan((PlannedRound(4, 0), PlannedRound(4, 2), PlannedRound(0, 0), PlannedRound(4, 4))),
        RoundPlan((PlannedRound(4, 4),)),
    ]
    for plan, eos in ((plans[0], None), (plans[1], full[5])):
        probe = StateChecking(ScriptedDrafter(prompt, full, plan, vocab_size=256), engine)
        engine.reset()
        engine.drafter = probe
        try:
            gen = engine.generate(prompt, n, eos_token_id=eos)
        finally:
            engine.drafter = None
        if list(gen.tokens) != greedy(prompt, n, eos):
            found.append(f"tokens differ from greedy (eos={eos})")
        results = check_generation(
            gen,
            prompt=prompt,
            k=engine.k,
            max_new_tokens=n,
            eos_token_id=eos,
            rollback=engine.rollback,
            final_processed=engine.target.processed,
        )
        found += [f"{inv}: {v[0].explanation}" for inv, v in results.items() if v]
        probe.check([*prompt, *gen.tokens], "after the generation")
        found += probe.problems
    # a session: a second request sharing only part of the first one's prompt
    engine.reset()
    long_prompt = bench_prompts()["code-edit"][:60]
    first = engine.generate(long_prompt, 4)
    edited = [*long_prompt[:30], *b"changed tail"]
    gen = engine.generate(edited, 12)
    if list(gen.tokens) != greedy(edited, 12):
        found.append("session: tokens differ from greedy after prefix reuse")
    probe = StateChecking(NgramDrafter(), engine)
    probe.check([*edited, *gen.tokens], "session: after the generation")
    found += probe.problems
    # prefix reuse as reported (capability sessions): nothing after a reset, at most the shared prefix
    # after an edit, something of a user turn that continues the last context exactly
    turn = [*edited, *gen.tokens, *b" ok"]
    third = engine.generate(turn, 4)
    reused = [g.stats.prefix_reused if g.stats else None for g in (first, gen, third)]
    if reused[0] != 0 or reused[1] is None or reused[1] > 30:
        found.append(f"session: prefix_reused {reused[:2]}: at most [0, 30] after a reset and an edit")
    held = len(edited) + len(gen.tokens) - 1
    if not reused[2] or reused[2] > held:
        found.append(f"session: prefix_reused {reused[2]} for a turn continuing the {held} tokens held")
    return found


@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_the_correct_engine_has_no_findings(start: Callable[..., ExecEngine], rollback: str) -> None:
    with start("--rollback", rollback) as engine:
        assert findings(engine) == []


@pytest.mark.parametrize("bug", BUGS)
@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
@pytest.mark.parametrize("mode", ["digest", "delta", "full"])
def test_every_planted_bug_is_caught(start: Callable[..., ExecEngine], bug: str, rollback: str, mode: str) -> None:
    with start("--rollback", rollback, "--bug", bug, state_mode=mode) as engine:
        assert f"planted bugs: {bug}" in json.dumps(engine.hello)
        assert engine.state_kind() == {"digest": "digests", "delta": "deltas", "full": "full arrays"}[mode]
        assert findings(engine), f"--bug {bug} ({rollback}, {mode}) went unnoticed"


@pytest.mark.parametrize("mode", ["digest", "delta", "full"])
def test_the_correct_engine_passes_every_state_mode(start: Callable[..., ExecEngine], mode: str) -> None:
    with start(state_mode=mode) as engine:
        assert findings(engine) == []
        if mode == "digest":
            view = engine.target
            # the C++ engine is not bit-equal to numpy: its digests were compared, not waved through by CRC
            assert view.digest_arrays > 0 and view.digest_slices_compared > 0


def test_state_deltas_leave_out_old_rows_and_a_changed_old_row_shows(start: Callable[..., ExecEngine]) -> None:
    """With state_delta the KV rows the client holds are left out; the CRC-32 still shows an old row
    the engine changed (planted bug old-kv-row), which the full arrays agree with."""
    prompt = PROMPTS[0]
    with start(state_mode="delta") as engine:
        engine.drafter = NgramDrafter()
        gen = engine.generate(prompt, 16)
        view = engine.target
        assert view.delta_arrays > 0 and view.rows_left_out > 0 and view.state_problem is None
        context = [*prompt, *gen.tokens]
        assert view.processed == len(context) - 1
        ref = reference("state")
        ref.reset()
        ref.forward(context[:-1])
        for name, array in ref.state_arrays().items():  # the reconstruction is the whole state
            assert np.allclose(view.state_arrays()[name], array, rtol=0, atol=engine.atol), name
    for mode in ("digest", "delta", "full"):
        with start("--rollback", "replay", "--bug", "old-kv-row", state_mode=mode) as engine:
            probe = StateChecking(NgramDrafter(), engine)
            engine.drafter = probe
            gen = engine.generate(prompt, 16)
            probe.check([*prompt, *gen.tokens], "after the generation")
            assert probe.problems, f"old-kv-row unnoticed ({mode})"
            if mode == "full":
                assert engine.target.delta_arrays == 0 and "key_cache differs" in " ".join(probe.problems)
            else:
                assert "CRC-32" in " ".join(probe.problems) and "rows before" in " ".join(probe.problems)


def test_unknown_bug_is_refused(native: tuple[Path, Path]) -> None:
    binary, weights = native
    done = subprocess.run([binary, "--weights", weights, "--bug", "nope"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown --bug 'nope'" in done.stderr


def test_refuses_weights_it_cannot_run(native: tuple[Path, Path], tmp_path: Path) -> None:
    binary, _ = native
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    done = subprocess.run([binary, "--weights", bad], capture_output=True, text=True, input="")
    assert done.returncode == 1 and "__metadata__.config" in done.stderr


def test_context_full_and_request_errors(start: Callable[..., ExecEngine]) -> None:
    with start("--max-context", "40") as engine:
        assert engine.max_context == 40 and engine.model == "trained:max_context=40"
        assert engine.oracle is not None and engine.oracle.max_context == 40
        prompt = list(b"The quick brown fox jumps over the ")
        gen = engine.generate(prompt, 20)
        assert gen.stop_reason == "context_full" and len(gen.tokens) == 40 - len(prompt) + 1
        assert list(gen.tokens) == greedy(prompt, 20)[: len(gen.tokens)]
        assert_clean(gen, prompt, engine, 20)
        with pytest.raises(EngineRequestError, match="more than max_context=40"):
            engine.generate(list(range(41)), 1)
        with pytest.raises(EngineRequestError, match="outside"):
            engine.greedy([300], 1)
        assert engine.greedy(prompt, 3) == greedy(prompt, 3)  # still usable


def test_cli_native_spec_and_export(native: tuple[Path, Path], tmp_path: Path) -> None:
    safe_open = pytest.importorskip("safetensors").safe_open

    weights = tmp_path / "w.safetensors"
    done = subprocess.run(
        [sys.executable, "-m", "specproof", "native", "spec", "--weights", str(weights), "--", "--bug", "stale-conv"],
        capture_output=True,
        text=True,
        check=True,
    )
    spec = done.stdout.strip()
    assert spec.startswith("exec:") and spec.endswith("--bug stale-conv") and str(weights) in spec
    with safe_open(str(weights), framework="numpy") as f:
        meta = f.metadata()
        assert meta["format"] == "specproof-weights/1" and meta["model"] == "trained"
        assert json.loads(meta["config"])["layers"] == ["conv", "attn", "conv", "attn"]
        assert len(list(f.keys())) == len(reference().weights)


def test_cli_export_weights_writes_a_target_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    safe_open = pytest.importorskip("safetensors").safe_open

    out = tmp_path / "small.safetensors"
    spec = "reference:d_model=16,vocab_size=32,max_context=16,layers=conv+attn"
    command = [sys.executable, "-m", "specproof", "native", "export-weights"]
    done = subprocess.run([*command, str(out), "--target", spec], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == str(out), done.stderr
    with safe_open(str(out), framework="numpy") as f:
        assert f.metadata()["model"] == spec
        assert len(list(f.keys())) == len(load_target(spec).weights)  # type: ignore[attr-defined]
    wrong = tmp_path / "x.safetensors"
    bad = subprocess.run([*command, str(wrong), "--target", "nope"], capture_output=True, text=True, check=False)
    lines = bad.stderr.strip().splitlines()  # one line naming the option, no traceback
    assert bad.returncode == 2 and len(lines) == 1 and not wrong.exists(), bad.stderr
    assert lines[0].startswith("specproof native: error: --target 'nope': unknown target"), bad.stderr


def test_traffic_and_protocol_overhead_are_reported(
    start: Callable[..., ExecEngine], native: tuple[Path, Path]
) -> None:
    with start() as engine:
        engine.drafter = NgramDrafter()
        gen = engine.generate([1, 2, 3, 1, 2, 3], 12)
        summary = engine.wire_summary()
        assert summary["generations"] == 1 and summary["rounds"] == len(gen.steps or ())
        assert summary["state"] == "digests"
        assert isinstance(summary["bytes_received"], int) and summary["bytes_received"] > 1000  # state dumps
        overhead = summary["overhead_us_per_round"]
        # an estimate: only the drafter's propose calls are subtracted (a clock read after the draft is
        # sent overlapped the engine's next compute); it stays loose because the machine is shared
        assert isinstance(overhead, float) and abs(overhead) < 1e6
        assert engine.traffic["wall_us"] > engine.traffic["engine_us"] > 0
        assert set(engine.last_drafts_sent) <= set(range(len(gen.steps or ())))
    received = {"digest": int(summary["bytes_received"])}  # type: ignore[call-overload]
    for mode, kind in (("delta", "deltas"), ("full", "full arrays")):  # the same generation: more bytes
        with start(state_mode=mode) as engine:
            engine.drafter = NgramDrafter()
            engine.generate([1, 2, 3, 1, 2, 3], 12)
            other = engine.wire_summary()
            assert other["state"] == kind and other["rounds"] == summary["rounds"]
            received[mode] = int(other["bytes_received"])  # type: ignore[call-overload]
    assert received["full"] > received["delta"] > received["digest"], received
    binary, weights = native
    spec = "exec:" + shlex.join([str(binary), "--weights", str(weights)])
    done = subprocess.run(
        [sys.executable, "-m", "specproof", "generate", "--engine", spec, "--ids", "1,2,3,1,2,3", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    from specproof.formats import validate

    assert validate("generate-1", out) == []  # a wire engine's summary (its own time, the traffic) too
    assert out["engine_elapsed_us"] > 0 and out["protocol_overhead_us_per_round"] is not None
    assert out["wire"]["state"] == "none" and out["wire"]["bytes_received"] > 0  # generate times the engine: no state


# --------------------------------------------------------------------------- certify over the wire

# Each planted bug and the invariant `specproof certify` must fail it on (quick profile).
CAUGHT_BY = {
    "stale-conv": "engine.state-restored",
    "processed-off-by-one": "engine.kv-length",
    "skip-restore-when-zero-accepted": "engine.state-restored",
    "bonus-from-wrong-row": "engine.accept-rule",
    "prefix-reuse-stale-state": "engine.session",
    "tokens-after-eos": "engine.stop",
    "old-kv-row": "engine.state-restored",
    "never-reuses-prefix": "engine.session",
    "overclaims-prefix-reuse": "engine.session",
}


def certify(native: tuple[Path, Path], *engine_args: str, only: str | None = None) -> Certified:
    binary, weights = native
    spec = "exec:" + shlex.join([str(binary), "--weights", str(weights), *engine_args])
    return certify_command(
        ["engine", "--engine", spec, "--profile", "quick", *(["--only", only] if only is not None else [])],
        timeout=300,
    )


@slow_certify
@pytest.mark.parametrize("bug", sorted(CAUGHT_BY))
def test_certify_rejects_every_planted_bug_on_its_invariant(native: tuple[Path, Path], bug: str) -> None:
    invariant = CAUGHT_BY[bug]
    done = certify(native, "--bug", bug, only=invariant)
    assert done.returncode == 1, done.output[-4000:]
    failed = re.compile(rf"^(fail\s+\S*{re.escape(invariant)}|.*{re.escape(invariant)}\s*│\s*fail\b)")
    assert any(failed.match(line) for line in done.output.splitlines()), done.output  # a line or a table row
    # a digest-sum failure's command starts by setting the key its signs were drawn with (a CRC or
    # shape failure's does not: no signs to draw again); tests/wire/test_wire_conformance.py pastes one
    key = r"(SPECPROOF_WIRE_DIGEST_KEY=[0-9a-f]{32} )?"
    reproduce = re.search(rf"reproduce: {key}specproof certify engine --engine", done.output)
    assert reproduce and f"--bug {bug}" in done.output, done.output
    if reproduce[1]:
        assert "$" + reproduce[1].strip() in done.output  # the key the failure message names


@slow_certify
@pytest.mark.parametrize("rollback", ["checkpoint", "replay"])
def test_certify_passes_the_correct_engine(native: tuple[Path, Path], rollback: str) -> None:
    done = certify(native, "--rollback", rollback)
    assert done.returncode == 0, done.output[-5000:]
    assert "verdict: PASS" in done.output
    assert "specproof-native-engine." in done.output  # checks named by the handshake's engine name


# --------------------------------------------------------------------------- the build


def test_a_broken_source_fails_the_build_and_the_source_tree_stays_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "native"
    shutil.copytree(native_dir(), src, ignore=shutil.ignore_patterns("build"))
    main = src / "src" / "main.cpp"
    main.write_text(main.read_text() + "\nthis is not C++;\n")
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    monkeypatch.setenv("SPECPROOF_NATIVE_DIR", str(src))
    monkeypatch.setenv("SPECPROOF_NATIVE_BUILD_DIR", str(tmp_path / "out"))
    if not (shutil.which("cmake") or shutil.which("g++") or shutil.which("c++")):
        with pytest.raises(NativeToolchainError, match="neither cmake nor a C\\+\\+ compiler"):
            build_native(quiet=True)
        return
    with pytest.raises(NativeBuildError) as info:
        build_native(quiet=True)
    assert not isinstance(info.value, NativeToolchainError)
    assert "this is not C++" in str(info.value) or "main.cpp" in str(info.value)  # the compiler's output
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before  # nothing written beside the sources
    assert not (tmp_path / "out" / "specproof-engine").exists()  # no binary from a failed build


def test_the_build_goes_to_a_folder_named_by_the_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPECPROOF_NATIVE_BUILD_DIR", raising=False)
    first = native_build_dir()
    assert native_dir() not in first.parents  # out of the source tree
    assert native_build_dir() == first  # same sources in the same folder, same build folder
    src = tmp_path / "native"
    shutil.copytree(native_dir(), src, ignore=shutil.ignore_patterns("build"))
    monkeypatch.setenv("SPECPROOF_NATIVE_DIR", str(src))
    copy = native_build_dir()
    assert copy != first  # another checkout never shares a CMake cache (CMake refuses one from another folder)
    assert native_build_dir() == copy
    (src / "src" / "main.cpp").write_text((src / "src" / "main.cpp").read_text() + "\n// changed\n")
    assert native_build_dir() not in (first, copy)  # a changed source is a new build, never a stale binary


def test_a_wide_model_digests_its_conv_state_in_slices_the_client_accepts(
    native: tuple[Path, Path], tmp_path: Path
) -> None:
    """A conv layer of 2304 channels x 2 taps (4608 values) is over the client's slice limit of 4096:
    the engine digests it a channel at a time (it sent one slice per layer before, a protocol error)."""
    binary, _ = native
    spec = "reference:d_model=2304,vocab_size=64,max_context=64,layers=conv+attn"
    weights = export_weights(tmp_path / "wide.safetensors", target=spec, load_target=load_target)
    with ExecEngine([str(binary), "--weights", str(weights)], timeout=60.0, load_target=load_target) as engine:
        assert engine.state_kind() == "digests"
        engine.drafter = NgramDrafter()
        prompt = [1, 2, 3, 1, 2, 3]
        gen = engine.generate(prompt, 6)
        assert list(gen.tokens) == list(greedy_decode(load_target(spec), prompt, 6).tokens)
        assert engine.target.state_problem is None and engine.restarts == 0
