"""The plan of a certification: what is certified, how hard, with which tolerances (resolved once).

``Plan.create`` validates every option before anything is built (bad input is a
``UsageError``); ``Plan.from_options`` is the one mapping from the options of
``_options.OPTIONS`` (as ``specproof certify`` and the pytest plugin parse them) to a plan,
opening the example database and reading the expected failures on the way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from specproof.conformance import _registry as registry
from specproof.conformance._options import OPTIONS, plan_arguments
from specproof.conformance._profiles import Profile, get_profile
from specproof.conformance._subjects import Suite
from specproof.contract import UsageError, validate_tolerance
from specproof.contract.errors import InvalidSettingError
from specproof.contract.sampling import SamplingParams, parse_sampling

__all__ = ["Plan"]


@attrs.frozen(kw_only=True)
class Plan:
    """Resolved subjects, profile, seed, tolerances and selection: everything a run depends on."""

    suite: Suite
    profile: Profile
    seed: int | None
    only: tuple[str, ...]
    specs: dict[str, str | None]
    tie_tolerance: float | None
    atol: float | None
    replay_session: str | None = None  # a session history file: engine.session replays it instead of searching
    max_context: int | None = None  # --max-context: the capacity an engine is tested at (default: the profile's)
    # Hypothesis' directory (--hypothesis-dir): a failing session's history file goes in its sessions/
    # (default: $SPECPROOF_HYPOTHESIS_DIR, else the user cache); nothing is written beside it
    storage: str | None = None
    # the example database (an ExampleStore, _database.py): failures are saved and replayed first
    database: Any = attrs.field(default=None, eq=False)
    expected_failures: dict[str, str] = attrs.field(factory=dict)  # invariant id -> reason (--expect-fail)
    sampling: SamplingParams | None = None  # --sampling: the sampling checks run at these parameters
    batches: bool = False  # --batches: the batch checks run (docs/contract.md, "Batches")
    decode_state: bool = False  # --decode-state: the decode-state checks run (docs/contract.md, "Decode state")
    trees: bool = False  # --trees: the tree checks run (docs/contract.md, "Trees")

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
        atol: float | None = None,
        oracle: str | None = None,
        only: tuple[str, ...] = (),
        replay_session: str | None = None,
        storage: str | None = None,
        max_context: int | None = None,
        database: Any = None,
        expected_failures: Mapping[str, str] | None = None,
        sampling: str | SamplingParams | None = None,
        batches: bool = False,
        decode_state: bool = False,
        trees: bool = False,
    ) -> Plan:
        """Validate every option before anything is built; bad input is a ``UsageError``."""
        prof = get_profile(profile)
        selected = registry.select(only)
        expected = {registry.get(i).id: str(r) for i, r in (expected_failures or {}).items()}
        tie, tol = _tolerances(tie_tolerance=tie_tolerance, atol=atol)
        _check_integers(max_context=max_context, seed=seed)
        params = _sampling(sampling)
        subject = subject or _inferred_subject(drafter=drafter, target=target, engine=engine)
        if replay_session is not None:
            from specproof.strategies import SessionHistory

            history = SessionHistory.load(replay_session)  # a bad file is a usage error before anything runs
            if not engine:
                raise UsageError("--replay-session replays a request history on an engine: give --engine")
        _check_subject(subject, engine=engine, oracle=oracle)
        suite = Suite.from_specs(
            subject,  # type: ignore[arg-type]
            drafter=drafter,
            target=target,
            engine=engine,
            tie_tolerance=tie,
            atol=tol,
            oracle=oracle,
        )
        _bound_capacity(suite, prof, max_context)
        if replay_session is not None:  # one that does not fit the engine is a usage error too, not a check's
            _check_history_fits(history, suite, source=replay_session)
        plan = cls(
            suite=suite,
            profile=prof,
            seed=seed,
            only=selected,
            specs={
                "drafter": drafter,
                "target": target,
                "engine": engine,
                "subject": subject,
                **({"oracle": oracle} if oracle is not None else {}),
            },
            tie_tolerance=tie,
            atol=tol,
            replay_session=replay_session,
            storage=storage,
            max_context=max_context,
            database=database,
            expected_failures=expected,
            sampling=params,
            batches=bool(batches),
            decode_state=bool(decode_state),
            trees=bool(trees),
        )
        _check_declarations(plan)
        return plan

    @classmethod
    def from_options(cls, values: Mapping[str, Any], *, flags: Literal["cli", "plugin"] = "cli") -> Plan:
        """The plan of these option values (by ``Option.dest``), as ``certify`` or the plugin parsed them.

        Checked before any work, in order: the output paths, the Hypothesis directory, the
        example database (a Redis server must answer), the expected failures, then the plan.
        ``flags`` says which flag names the errors use (``--db`` or ``--specproof-db``).
        """
        from specproof.conformance._database import check_storage, default_examples_dir, open_database, storage_dir
        from specproof.conformance._expected import declared_failures
        from specproof.contract.files import check_output_path

        flag = {o.dest: (o.cli if flags == "cli" else o.plugin) for o in OPTIONS}
        for dest in ("report", "markdown"):
            if values.get(dest):
                check_output_path(values[dest], option=flag[dest])
        storage = storage_dir(values.get("hypothesis_dir"), option=flag["hypothesis_dir"])
        check_storage(storage, option=flag["hypothesis_dir"])  # its sessions/ too, for the plugin as for certify
        database = open_database(
            values.get("db"),
            default_dir=default_examples_dir(storage),
            option=flag["db"],
            replay=values.get("db_replay") or "all",
        )
        expected = declared_failures(values.get("expect_fail_file"), values.get("expect_fail") or ())
        return cls.create(
            **plan_arguments(values),
            storage=str(storage),
            database=database,
            expected_failures=expected,
        )

    def close(self) -> None:
        """Close the engines that hold a process or a socket (``exec:``, ``tcp:``): the run is over."""
        for case in self.suite.engines:
            close = getattr(case.engine, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # pragma: no cover - closing is best effort
                    pass


def _sampling(value: str | SamplingParams | None) -> SamplingParams | None:
    """``--sampling`` as parameters; the checks choose the seeds (each generation its own), so none is given."""
    if value is None or isinstance(value, SamplingParams):
        params = value
    else:
        try:
            params = parse_sampling(value)
        except InvalidSettingError as exc:
            raise UsageError(f"--sampling: {exc}") from None
    if params is not None and params.seed is not None:
        raise UsageError("--sampling takes no seed: the sampling checks seed each generation themselves (0, 1, ...)")
    return params


def _tolerances(*, tie_tolerance: float | None, atol: float | None) -> tuple[float | None, float | None]:
    """``--tie-tolerance`` and ``--atol`` validated (None: the subject's declared ones); a ``UsageError`` else."""
    try:
        tie = None if tie_tolerance is None else validate_tolerance(tie_tolerance, name="--tie-tolerance")
        tol = None if atol is None else validate_tolerance(atol, name="--atol")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return tie, tol


def _check_subject(subject: str, *, engine: str | None, oracle: str | None) -> None:
    """The options that go only with some subjects: ``--oracle`` with a target, ``--engine`` with an engine."""
    if oracle is not None and (subject not in ("target", "all") or engine):
        raise UsageError("--oracle names the model a target was converted from: it goes with `certify target`")
    if subject in ("drafter", "target") and engine:
        raise UsageError(f"certify {subject} takes no --engine (an engine is certified with `certify engine`)")


def _check_history_fits(history: Any, suite: Suite, *, source: str) -> None:
    """A replayed request history fits every engine of the suite (its context and vocabulary)."""
    for case in suite.engines:
        history.check_fits(
            engine=case.id, max_context=case.max_context, vocab_size=case.vocab_size or None, source=source
        )


def _check_integers(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise UsageError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
    max_context = values.get("max_context")
    if max_context is not None and max_context < 2:
        raise UsageError(f"--max-context must be at least 2 (a prompt and a pending token), got {max_context}")


def _inferred_subject(*, drafter: str | None, target: str | None, engine: str | None) -> str:
    """The subject the specs given imply: an engine, a lone drafter or target, else the whole stack."""
    if engine:
        return "engine"
    if drafter and not target:
        return "drafter"
    if target and not drafter:
        return "target"
    return "all"


def _bound_capacity(suite: Suite, profile: Profile, max_context: int | None) -> None:
    """Each engine case's tested capacity: its max_context, bounded by --max-context or the profile;
    a bound below max_context is noted on the certificate (paths at max_context were not reached)."""
    bound, source = (
        (max_context, f"--max-context {max_context}")
        if max_context is not None
        else (profile.max_capacity, f"the {profile.name} profile's capacity of {profile.max_capacity} tokens")
    )
    for case in suite.engines:
        declared = case.max_context
        if declared is None and case.kind == "builtin" and suite.target is not None:
            declared = suite.target.max_context
        if declared is None:
            continue
        case.capacity = min(declared, bound)
        if case.capacity < declared:
            case.notes.append(
                f"capacity tested: contexts up to {case.capacity} tokens ({source}); the engine declares "
                f"max_context={declared}, so the paths at max_context (a round clamped by the context, "
                f"stop_reason context_full) were NOT exercised at {declared}; --max-context N sets the capacity"
            )


def _check_declarations(plan: Plan) -> None:
    """A declared expected failure names a check this plan runs: one it never runs (deselected by
    ``--only``, another subject's invariant, a check that applies to none of the cases) is a
    ``UsageError`` before any work, not a line printed on the certificate."""
    if not plan.expected_failures:
        return
    from specproof.conformance._checks import generate_checks

    runs = {item.invariant.id for s in ("drafter", "target", "engine") for item in generate_checks(plan, s)}
    for invariant_id in plan.expected_failures:
        if invariant_id in runs:
            continue
        subject = plan.specs.get("subject")
        if plan.only and invariant_id not in plan.only:
            why = f"--only selects {', '.join(plan.only)}"
        else:
            why = f"it is no check of `certify {subject}` on these subjects"
        raise UsageError(
            f"--expect-fail {invariant_id}: that check does not run ({why}); a declaration must name a check "
            "that runs (remove it, or select the check)"
        )
