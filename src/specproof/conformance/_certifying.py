"""What each certifying test runs: one Hypothesis search per (subject case, invariant id).

The test modules (``test_drafter.py``, ``test_target.py``, ``test_engine.py``,
``test_stateful.py``) are one line each; the plugin parametrizes them from the
resolved ``Suite`` so every invariant is its own pytest id (``-k engine.kv-length``).
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
import time
from typing import Any

import attrs
import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from specproof import __version__
from specproof.conformance._harness import ENGINE_INVARIANTS, run_builtin, run_plugin
from specproof.conformance._invariants import CATALOGUE, Violation, ViolationError
from specproof.conformance._profiles import Profile, get_profile
from specproof.conformance._results import CheckResult, Recorder
from specproof.conformance._subjects import EngineCase, Suite
from specproof.conformance.checks import drafter as drafter_checks
from specproof.conformance.checks import target as target_checks
from specproof.engine import SpecproofError, greedy_decode
from specproof.strategies import ScriptedDrafter, contexts, round_plans

__all__ = ["CertifyContext", "CheckSpec"]

DRAFTER_INVARIANTS = ("drafter.max-length", "drafter.token-range", "drafter.deterministic", "drafter.no-mutation")
TARGET_INVARIANTS = (
    "target.shape",
    "target.processed",
    "target.chunk-invariance",
    "target.causality",
    "target.restore",
    "target.checkpoints",
    "target.capacity",
)
STATEFUL_ID = "stateful.rollback-machine"


def _spec_version(spec: str | None) -> str | None:
    """The version of the package a plug-in spec comes from (``mypkg.x:make`` -> mypkg's version)."""
    if not spec:
        return None
    family = spec.split(":", 1)[0]
    builtin = family in ("ngram", "reference", "reference-moe", "trained", "coreml")
    if builtin or ("." not in family and ":" not in spec):
        return __version__
    top = family.split(".")[0]
    if top in ("mlx", "hf"):
        dist = {"mlx": "mlx-lm", "hf": "transformers"}[top]
    else:
        mod = sys.modules.get(top)
        version = getattr(mod, "__version__", None)
        if isinstance(version, str):
            return version
        dist = importlib.metadata.packages_distributions().get(top, [top])[0]
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@attrs.frozen
class CheckSpec:
    kind: str  # drafter | target | engine | stateful
    invariant: str
    case: str
    engine: EngineCase | None = attrs.field(default=None, eq=False, repr=False)

    def __str__(self) -> str:
        return f"{self.case}-{self.invariant}" if self.kind in ("engine", "stateful") else self.invariant


@attrs.define
class CertifyContext:
    suite: Suite
    profile: Profile
    seed: int | None
    tolerance: float
    specs: dict[str, str | None]
    recorder: Recorder = attrs.Factory(Recorder)
    started: float = attrs.Factory(time.perf_counter)

    @classmethod
    def create(
        cls,
        subject: str | None = None,
        *,
        drafter: str | None = None,
        target: str | None = None,
        engine: str | None = None,
        profile: str = "quick",
        seed: int | None = None,
        tie_tolerance: float | None = None,
    ) -> CertifyContext:
        prof = get_profile(profile)
        if subject is None:
            subject = (
                "engine"
                if engine
                else "drafter"
                if drafter and not target
                else "target"
                if target and not drafter
                else "all"
            )
        suite = Suite.from_specs(
            subject,  # type: ignore[arg-type]
            drafter=drafter,
            target=target,
            engine=engine,  # type: ignore[arg-type]
            tolerance=tie_tolerance,
        )
        tol = tie_tolerance if tie_tolerance is not None else (suite.target.tolerance if suite.target else 0.0)
        return cls(
            suite=suite,
            profile=prof,
            seed=seed,
            tolerance=tol,
            specs={"drafter": drafter, "target": target, "engine": engine, "subject": subject},
        )

    @classmethod
    def from_pytest_config(cls, config: pytest.Config) -> CertifyContext:
        opt = config.getoption
        return cls.create(
            opt("--specproof-subject"),
            drafter=opt("--specproof-drafter"),
            target=opt("--specproof-target"),
            engine=opt("--specproof-engine"),
            profile=opt("--specproof-profile"),
            seed=opt("--specproof-seed"),
            tie_tolerance=opt("specproof_tie_tolerance"),
        )

    # ---- parametrization -----------------------------------------------------------------

    def parametrize(self, function: str) -> list[tuple[str, CheckSpec]]:
        specs: list[CheckSpec] = []
        if function == "test_drafter" and self.suite.certify_drafter:
            specs = [CheckSpec("drafter", inv, "drafter") for inv in DRAFTER_INVARIANTS]
        elif function == "test_target" and self.suite.certify_target:
            specs = [CheckSpec("target", inv, "target") for inv in TARGET_INVARIANTS]
        elif function == "test_engine":
            specs = [
                CheckSpec("engine", inv, case.id, case) for case in self.suite.engines for inv in ENGINE_INVARIANTS
            ]
        elif function == "test_stateful":
            specs = [
                CheckSpec("stateful", STATEFUL_ID, case.id, case)
                for case in self.suite.engines
                if case.kind == "builtin" and self.suite.target is not None
            ]
        if not specs:
            return [("not-requested", CheckSpec("none", "none", "none"))]
        return [(str(s), s) for s in specs]

    # ---- running ---------------------------------------------------------------------------

    def run(self, check: CheckSpec, nodeid: str) -> None:
        if check.kind == "none":
            pytest.skip("not part of this certification (see --specproof-subject)")
        result = self.recorder.get(nodeid, check.invariant, check.case)
        start = time.perf_counter()
        try:
            getattr(self, f"_run_{check.kind}")(check, result)
        finally:
            result.seconds = time.perf_counter() - start

    def _settings(self, fn: Any, *, max_examples: int | None = None) -> Any:
        fn = self.profile.hypothesis_settings(seed=self.seed, max_examples=max_examples)(fn)
        if self.seed is not None:
            fn = hypothesis.seed(self.seed)(fn)
        return fn

    def _run_drafter(self, check: CheckSpec, result: CheckResult) -> None:
        dsub = self.suite.drafter
        assert dsub is not None
        vocab = self.suite.target.vocab_size if self.suite.target else 256
        inv = check.invariant

        @hypothesis.given(data=st.data())
        def search(data: st.DataObject) -> None:
            result.examples += 1
            ctx = data.draw(contexts(vocab, min_size=1, max_size=self.profile.max_prompt * 2), label="context")
            ks = data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=6), label="k per call")
            if inv == "drafter.deterministic":
                other = data.draw(contexts(vocab, min_size=1, max_size=24), label="unrelated context seen before reset")
                vs = drafter_checks.check_deterministic(dsub.make, ctx, ks, other=other)
            elif inv == "drafter.token-range":
                vs = drafter_checks.check_token_range(dsub.make(), ctx, ks, vocab_size=vocab)
            else:
                vs = drafter_checks.DRAFTER_CHECKS[inv](dsub.make(), ctx, ks)
            if vs:
                raise ViolationError(vs)

        self._settings(search)()

    def _run_target(self, check: CheckSpec, result: CheckResult) -> None:
        tsub = self.suite.target
        assert tsub is not None
        vocab, tol, inv = tsub.vocab_size, tsub.tolerance, check.invariant
        prefix_max = min(self.profile.max_prompt, max(0, tsub.max_context - 16))
        tokens_st = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=9)
        if inv == "target.checkpoints" and not tsub.has_checkpoints:
            result.detail = "no forward_with_checkpoints (replay rollback only)"
            pytest.skip(result.detail)

        @hypothesis.given(data=st.data())
        def search(data: st.DataObject) -> None:
            result.examples += 1
            prefix = data.draw(contexts(vocab, min_size=0, max_size=prefix_max), label="prefix")
            tokens = data.draw(tokens_st, label="tokens")
            if inv == "target.chunk-invariance":
                chunks = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=6), label="chunks")
                vs = target_checks.check_chunk_invariance(tsub.make, prefix, tokens, chunks, tolerance=tol)
            elif inv == "target.causality":
                split = data.draw(st.integers(1, len(tokens)), label="split")
                repl = data.draw(
                    st.lists(st.integers(0, vocab - 1), min_size=len(tokens), max_size=len(tokens)), label="replacement"
                )
                vs = target_checks.check_causality(tsub.make, prefix, tokens, split, repl, tolerance=tol)
            elif inv in ("target.restore", "target.checkpoints"):
                probe = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3), label="probe")
                vs = (target_checks.check_restore if inv == "target.restore" else target_checks.check_checkpoints)(
                    tsub.make, prefix, tokens, probe, tolerance=tol
                )
            elif inv == "target.capacity":
                overflow = data.draw(st.integers(2, 5), label="overflow tokens")
                vs = target_checks.check_capacity(tsub.make, prefix or tokens, overflow, tokens[0])
            else:
                vs = target_checks.TARGET_CHECKS[inv](tsub.make, prefix, tokens)
            if vs:
                raise ViolationError(vs)

        n = self.profile.capacity_examples if inv == "target.capacity" else None
        self._settings(search, max_examples=n)()

    def _run_engine(self, check: CheckSpec, result: CheckResult) -> None:
        case = check.engine
        assert case is not None
        inv = check.invariant
        tol = self.tolerance
        applicable = [0]

        def record(run: dict[str, Any]) -> None:
            vs = run.get(inv)
            if vs is None:
                return
            applicable[0] += 1
            if vs:
                raise ViolationError(vs)
            verdict = run.get("lossless-verdict")
            if inv == "engine.lossless" and verdict is not None and verdict.status == "excused":
                result.excused += 1
                if verdict.margin is not None:
                    result.excused_margins.append(float(verdict.margin))

        if case.kind == "plugin":
            vocab = case.vocab_size
            max_prompt = self.profile.max_prompt
            if case.max_context:
                max_prompt = min(max_prompt, case.max_context - 1)

            @hypothesis.given(data=st.data())
            def search(data: st.DataObject) -> None:
                result.examples += 1
                prompt = data.draw(contexts(vocab, min_size=1, max_size=max_prompt), label="prompt")
                n = data.draw(st.integers(1, self.profile.max_new_tokens), label="max_new_tokens")
                expected, _ = case.greedy(prompt, n, None)  # type: ignore[misc]
                eos = data.draw(st.none() | st.sampled_from(expected or [0]), label="eos_token_id")
                record(run_plugin(case, prompt=prompt, max_new_tokens=n, eos=eos, tolerance=tol))

        else:
            tsub = self.suite.target
            dsub = self.suite.drafter
            assert tsub is not None and dsub is not None
            vocab, cap = tsub.vocab_size, tsub.max_context
            max_prompt = min(self.profile.max_prompt, cap - 1)
            reference = tsub.make()

            @hypothesis.given(data=st.data())
            def search(data: st.DataObject) -> None:
                result.examples += 1
                k = data.draw(st.integers(0, 8), label="k")
                n = data.draw(st.integers(1, self.profile.max_new_tokens), label="max_new_tokens")
                near_end = (
                    cap <= 4 * self.profile.max_prompt or data.draw(st.integers(0, 15), label="near max_context") == 0
                )
                if near_end and data.draw(st.booleans(), label="prompt ends near max_context"):
                    room = data.draw(st.integers(1, 10), label="free context slots")
                    unit = data.draw(contexts(vocab, min_size=1, max_size=6), label="prompt unit")
                    prompt = [unit[i % len(unit)] for i in range(max(1, cap - room))]
                else:
                    prompt = data.draw(contexts(vocab, min_size=1, max_size=max_prompt), label="prompt")
                continuation = list(greedy_decode(reference, prompt, n).tokens)
                eos = data.draw(st.none() | st.sampled_from(continuation or [0]), label="eos_token_id")
                kind = data.draw(st.sampled_from(["scripted", "subject"]), label="drafter")
                script: object = None
                if kind == "scripted" and vocab >= 2:
                    plan = data.draw(round_plans(k=k, max_rounds=8), label="round plan")
                    drafter: Any = ScriptedDrafter(prompt, continuation, plan, vocab_size=vocab)
                    script = plan.describe()
                else:
                    kind = "subject"
                    drafter = dsub.make()
                record(
                    run_builtin(
                        make_target=tsub.make,
                        drafter=drafter,
                        drafter_kind=f"{kind}:{dsub.name}",
                        prompt=prompt,
                        k=k,
                        rollback=case.rollback or "replay",
                        max_new_tokens=n,
                        eos=eos,
                        tolerance=tol,
                        cache_key=(tsub.spec, dsub.spec),
                        script=script,
                    )
                )

        self._settings(search)()
        if applicable[0] == 0:
            result.detail = "not applicable to this engine's output (no steps / no stats)"
            pytest.skip(result.detail)

    def _run_stateful(self, check: CheckSpec, result: CheckResult) -> None:
        from hypothesis.stateful import run_state_machine_as_test

        from specproof.strategies import RollbackMachine

        tsub = self.suite.target
        assert tsub is not None and check.engine is not None
        rollback = check.engine.rollback or "replay"
        machine = RollbackMachine.configure(target_factory=tsub.make, tolerance=tsub.tolerance, rollbacks=(rollback,))
        counter = [0]

        class Counted(machine):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                counter[0] += 1
                super().__init__()

        settings = self.profile.hypothesis_settings(seed=self.seed, max_examples=self.profile.stateful_examples)
        try:
            run_state_machine_as_test(Counted, settings=settings)
        except (AssertionError, SpecproofError) as exc:
            text = str(exc) if isinstance(exc, AssertionError) else f"[engine.lossless] {type(exc).__name__}: {exc}"
            inv = text[1 : text.index("]")] if text.startswith("[") and "]" in text else "engine.state-restored"
            if inv not in CATALOGUE:
                inv = "engine.state-restored"
            raise ViolationError(
                [
                    Violation(
                        invariant=inv,
                        explanation=f"RollbackMachine: {text.splitlines()[0]}",
                        example={"machine": text[:2000]},
                    )
                ]
            ) from exc
        finally:
            result.examples = counter[0]

    # ---- results ---------------------------------------------------------------------------

    def observe(self, nodeid: str, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
        result = self.recorder.results.get(nodeid)
        if result is None:
            return
        if report.skipped:
            result.status = "skip"
            if not result.detail and call.excinfo is not None:
                result.detail = str(call.excinfo.value)
            return
        if report.passed:
            result.status = "excused" if result.excused else "pass"
            if result.excused:
                lo, hi = min(result.excused_margins, default=0), max(result.excused_margins, default=0)
                result.detail = f"{result.excused} excused divergence(s), top-2 margins {lo:.3g}..{hi:.3g}"
            return
        exc = call.excinfo.value if call.excinfo is not None else None
        group = getattr(exc, "exceptions", None)  # an exception group (Python 3.10 has no builtin name)
        if isinstance(group, tuple) and group and all(isinstance(e, ViolationError) for e in group):
            # Hypothesis' FlakyFailure: a nondeterministic subject failed, then passed on replay
            exc = ViolationError([v for e in group for v in e.violations])
        if isinstance(exc, ViolationError):
            result.status = "fail"
            result.violations = exc.violations
            result.detail = str(exc.violations[0]).splitlines()[0]
        else:
            result.status = "error"
            result.detail = f"{type(exc).__name__}: {exc}" if exc is not None else "failed"
        result.reproduce = self.reproduce_command(result)

    def reproduce_command(self, result: CheckResult) -> str:
        parts = ["specproof", "certify", str(self.specs.get("subject") or "all")]
        for key in ("drafter", "target", "engine"):
            if self.specs.get(key):
                parts += [f"--{key}", str(self.specs[key])]
        parts += ["--profile", self.profile.name, "--only", result.invariant]
        if self.seed is not None:
            parts += ["--seed", str(self.seed)]
        if self.tolerance:
            parts += ["--tie-tolerance", repr(self.tolerance)]
        return " ".join(parts)

    def report(self) -> dict[str, Any]:
        results = list(self.recorder.results.values())
        suite = self.suite
        failed = [r for r in results if r.status in ("fail", "error")]
        return {
            "format": "specproof-report/1",
            "specproof_version": __version__,
            "verdict": "fail" if failed else "pass",
            "subjects": {
                "subject": self.specs.get("subject"),
                "drafter": {
                    "spec": suite.drafter.spec,
                    "name": suite.drafter.name,
                    "version": _spec_version(suite.drafter.spec),
                }
                if suite.drafter
                else None,
                "target": {
                    "spec": suite.target.spec,
                    "name": suite.target.name,
                    "description": suite.target.describe(),
                    "version": _spec_version(suite.target.spec),
                }
                if suite.target
                else None,
                "engines": [
                    {
                        "case": c.id,
                        "name": c.name,
                        "kind": c.kind,
                        "version": _spec_version(self.specs.get("engine")) if c.kind == "plugin" else __version__,
                    }
                    for c in suite.engines
                ],
            },
            "profile": self.profile.name,
            "seed": self.seed,
            "derandomized": self.seed is None,
            "tie_tolerance": self.tolerance,
            "hypothesis_version": hypothesis.__version__,
            "numpy_version": np.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "seconds": round(time.perf_counter() - self.started, 3),
            "results": [r.to_json() for r in results],
        }
