"""What is being certified: the subjects resolved from specs, and how to make fresh copies.

``Suite.from_specs`` follows docs/contract.md ("Engines"): a drafter subject runs under the built-in
engine on the chosen target; a target subject gets the target invariants and then
the built-in engine on it; an engine subject is white-box (its Generation has
steps) or black-box (``vocab_size`` plus ``target`` or ``greedy``).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs

from specproof.conformance._records import Capabilities
from specproof.conformance.checks.features import feature_layers_of
from specproof.contract import validate_tolerance
from specproof.contract.errors import PluginError
from specproof.engine import Drafter, Target
from specproof.engine.conventions import component_name
from specproof.engine.plugin_modules import declared_capabilities, takes_suite_drafts
from specproof.plugins import drafter_factory, load_target, plugin_factory

__all__ = ["DEFAULT_TARGET", "DrafterSubject", "EngineCase", "SourceModel", "Suite", "TargetSubject"]

# The built-in stack's target: the reference hybrid at a 512-token context (`--target reference` is the
# same model at 4096). Every path of the target and engine checks is reached at 512 as at 4096: the
# near-max_context prompts, the refused overflow, the clamped round. The longer context only made each
# of those fills 8-16x dearer, about half of `certify --profile quick` (docs/certify.md, The built-in stack).
DEFAULT_TARGET = "reference:max_context=512"
SubjectKind = Literal["drafter", "target", "engine", "all"]


def _copier(proto: object, rebuild: Callable[[], object] | None) -> Callable[[], object]:
    """Fresh instances: a deep copy of a pristine prototype (cheap), else the factory again."""
    try:
        copy.deepcopy(proto)
    except Exception:
        if rebuild is None:
            raise PluginError(
                f"{component_name(proto)} is an instance that cannot be copied; expose a factory instead"
            ) from None
        return rebuild
    return lambda: copy.deepcopy(proto)


@attrs.define
class TargetSubject:
    spec: str
    prototype: Target
    make: Callable[[], Target]
    tie_tolerance: float  # the top-2 margin below which a divergence from greedy is excused
    atol: float  # the absolute tolerance on logits and recurrent state
    # --oracle: the model the target was converted from (target.matches-source compares with it)
    source: SourceModel | None = None

    @classmethod
    def from_spec(
        cls, spec: str, *, tie_tolerance: float | None = None, atol: float | None = None, oracle: str | None = None
    ) -> TargetSubject:
        proto = load_target(spec)
        tie, tol = declared_tolerances(proto, tie_tolerance=tie_tolerance, atol=atol)
        if oracle is None:  # a target may name the model it was converted from; --oracle overrides it
            oracle = declared_source(proto)
        source = None if oracle is None else SourceModel.from_spec(oracle, target=proto, target_spec=spec)
        return cls(spec=spec, prototype=proto, make=_fresh(proto, spec), tie_tolerance=tie, atol=tol, source=source)

    @property
    def name(self) -> str:
        return component_name(self.prototype)

    @property
    def vocab_size(self) -> int:
        return int(self.prototype.vocab_size)

    @property
    def max_context(self) -> int:
        return int(self.prototype.max_context)

    @property
    def white_box(self) -> bool:
        return callable(getattr(self.prototype, "state_arrays", None))

    @property
    def has_checkpoints(self) -> bool:
        return callable(getattr(self.prototype, "forward_with_checkpoints", None))

    def exposes(self) -> Capabilities:
        """What the target exposes: the capabilities target invariants' ``needs`` are judged against."""
        return Capabilities(
            has={
                *(("forward_with_checkpoints",) if self.has_checkpoints else ()),
                *(("source",) if self.source else ()),
            },
            why_not={
                "forward_with_checkpoints": "the target has no forward_with_checkpoints()",
                "source": "no --oracle SPEC and no source_spec on the target: the model it was converted from "
                "was not given",
            },
        )

    def describe(self) -> str:
        describe = getattr(self.prototype, "describe", None)
        return str(describe()) if callable(describe) else self.name


def declared_tolerances(
    component: object, *, tie_tolerance: float | None = None, atol: float | None = None
) -> tuple[float, float]:
    """The tolerances in force: the options given, else what the component declares, else 0 (exact).

    A component declares ``tie_tolerance`` (the top-2 margin that excuses a divergence) and
    ``atol`` (absolute tolerance on logits and state); one that declares only
    ``tie_tolerance`` gets it as ``atol`` too (the single tolerance of earlier versions).
    """
    declared_tie = getattr(component, "tie_tolerance", None)
    declared_atol = getattr(component, "atol", None)
    tie = tie_tolerance if tie_tolerance is not None else float(declared_tie or 0.0)
    if atol is None:
        atol = float(declared_atol) if declared_atol is not None else float(declared_tie or 0.0)
    return (validate_tolerance(tie, name="tie_tolerance"), validate_tolerance(atol, name="atol"))


def _fresh(proto: object, spec: str) -> Callable[[], Target]:
    """Fresh, reset copies of the target ``spec`` loaded as ``proto``."""
    make = _copier(proto, lambda: load_target(spec))

    def fresh() -> Target:
        t = make()
        t.reset()  # type: ignore[attr-defined]
        return t  # type: ignore[return-value]

    return fresh


def declared_source(target: object) -> str | None:
    """The target spec a target names as the model it was converted from (``source_spec``), or None."""
    declared = getattr(target, "source_spec", None)
    if declared is not None and (not isinstance(declared, str) or not declared.strip()):
        raise PluginError(f"source_spec={declared!r}: expected a target spec (the model the target was converted from)")
    return declared


@attrs.define
class SourceModel:
    """``--oracle SPEC``: the model a target was converted from, and how closely the target must follow it.

    ``rtol`` (of a row's largest |source logit|) and ``router_margin`` are what the *target* declares
    for its precision against its source (``source_rtol``, ``source_router_margin``; 0 when it
    declares none: exact, nothing excused)."""

    spec: str
    make: Callable[[], Target]
    rtol: float
    router_margin: float

    @classmethod
    def from_spec(cls, spec: str, *, target: object, target_spec: str) -> SourceModel:
        try:
            proto = load_target(spec)
        except PluginError as exc:
            raise PluginError(f"--oracle {spec!r}: {exc}") from exc
        theirs, ours = int(proto.vocab_size), int(target.vocab_size)  # type: ignore[attr-defined]
        if theirs != ours:
            raise PluginError(
                f"--oracle {spec!r} has vocab_size={theirs}, the target {target_spec!r} {ours}: not the model the "
                "target was converted from"
            )
        rtol = validate_tolerance(float(getattr(target, "source_rtol", 0.0) or 0.0), name="source_rtol")
        margin = validate_tolerance(
            float(getattr(target, "source_router_margin", 0.0) or 0.0), name="source_router_margin"
        )
        return cls(spec=spec, make=_fresh(proto, spec), rtol=rtol, router_margin=margin)


@attrs.define
class DrafterSubject:
    spec: str
    make: Callable[[], Drafter]
    name: str

    @classmethod
    def from_spec(cls, spec: str) -> DrafterSubject:
        factory = drafter_factory(spec)  # ngram[:...], model:TARGET, combined:TARGET, MODULE:ATTR
        first = factory()
        if factory() is first:  # an instance plug-in: copies stand in for fresh drafters
            make = _copier(first, None)
        else:
            make = factory
        return cls(spec=spec, make=make, name=component_name(first))  # type: ignore[arg-type]


@attrs.define(eq=False)
class EngineCase:
    """One engine configuration the engine invariants run on (docs/contract.md, "engines").

    ``builtin`` cases are SpecDecoder with a fixed rollback strategy on the target subject.
    ``plugin`` cases follow the engine contract: ``live_target`` is the target the engine
    decodes on (white-box and per-round state checks), ``make_reference`` gives fresh copies
    of the model it decodes (its ``oracle``, else a pristine copy of ``target``) for plain
    greedy and state comparisons, ``greedy_fn`` is its ``greedy()`` where there is no model;
    ``takes_drafter`` says that the suite can install its scripted drafter on ``drafter``.
    """

    id: str
    kind: Literal["builtin", "plugin"]
    name: str = ""
    rollback: str | None = None
    engine: Any = None
    k: int | None = None
    vocab_size: int = 0
    max_context: int | None = None
    # the longest context the examples build: max_context, bounded by the profile or --max-context
    capacity: int | None = None
    live_target: Any = None
    make_reference: Callable[[], Target] | None = None
    greedy_fn: Callable[[Sequence[int], int], Sequence[int]] | None = None
    make_engine: Callable[[], Any] | None = None  # a fresh session: reset() the instance, else the factory
    # a newly built engine from the subject's factory (what `--replay-session` replays on from the command
    # line): to see a history fail on an engine that served nothing before; None for a built-in case
    build_engine: Callable[[], Any] | None = None
    takes_drafter: bool = False
    own_drafter: Any = None
    # the layers the suite's (scripted) drafter declares in place of a feature drafter's: the --drafter
    # subject's, for an engine that says which feature layers it reports (a wire engine: capability features)
    feature_layers: tuple[int, ...] | None = None
    notes: list[str] = attrs.Factory(list)
    live_confirmed: bool | None = None
    tie_tolerance: float = 0.0
    atol: float = 0.0
    # unique per case for the run cache (an id() can be reused once a case is freed)
    token: int = attrs.field(factory=itertools.count().__next__)

    @property
    def observable(self) -> bool:
        """The live target can be probed with a forward (no state arrays to read instead)."""
        live = self.live_target
        return (
            live is not None
            and not callable(getattr(live, "state_arrays", None))
            and all(callable(getattr(live, m, None)) for m in ("forward", "snapshot", "restore"))
        )

    @property
    def state_note(self) -> str:
        if self.live_target is None:
            own = getattr(self.engine, "no_state_reason", None)  # a wire engine words it in protocol terms
            if isinstance(own, str) and own:
                return own
            return "the engine exposes no live target (`target`), so its state cannot be read"
        if self.make_reference is None:
            return "no model to compare the live target with (expose `oracle`)"
        return "the live target has no state_arrays() and cannot be probed"

    def confirm_live(self, moved: bool) -> None:
        self.live_confirmed = moved
        if not moved:
            self.notes.append(
                "engine.target did not change during a generation: it is not the target the engine decodes on, "
                "so it is used as an oracle of the same model (lossless only); expose it as `oracle`"
            )
            self.live_target = None

    def exposes(self) -> Capabilities:
        """What the case exposes before any generation (a run adds steps, stats and state)."""
        if self.kind == "builtin":
            return Capabilities(
                has={"oracle", "builtin", "steps", "stats", "rollback"},
                why_not={"sessions": "SpecDecoder keeps no cache between calls (the rollback machine drives sessions)"},
            )
        oracle = self.make_reference is not None or self.greedy_fn is not None
        return Capabilities(
            has={"sessions", *(("oracle",) if oracle else ())},
            why_not={
                "builtin": "a plug-in engine: the rollback machine drives the built-in decoder only",
                "oracle": "the engine exposes no model (`oracle`, `target`) and no `greedy()`",
            },
        )

    def capabilities(self) -> dict[str, object]:
        return {
            "steps": None,  # known after the first generation
            "live_target": self.live_target is not None,
            "state_arrays": callable(getattr(self.live_target, "state_arrays", None)),
            "oracle": self.make_reference is not None,
            "greedy": self.greedy_fn is not None,
            "suite_drafts": self.takes_drafter,
            "declared": sorted(declared) if (declared := declared_capabilities(self.engine)) is not None else None,
            "k": self.k,
            "rollback": self.rollback,
        }


def _settable(obj: object, name: str) -> bool:
    if not hasattr(obj, name):
        return False
    try:
        setattr(obj, name, getattr(obj, name))
    except Exception:
        return False
    return True


def _case_id(spec: str, engine: object = None) -> str:
    """A short id for an engine (the pytest id and report row): the name an engine declares
    (``engine_name``, a wire engine's handshake name), else the attribute, the program, the address."""
    declared = getattr(engine, "engine_name", None)
    if isinstance(declared, str) and declared.strip():
        import re

        return re.sub(r"[^\w.+-]+", "-", declared.strip())
    kind, _, rest = spec.partition(":")
    if kind == "exec":
        import os
        import shlex

        try:
            argv = shlex.split(rest)
        except ValueError:
            argv = rest.split()
        return os.path.basename(argv[0]) if argv else "exec"
    if kind == "tcp":
        return "tcp-" + rest.replace(":", "-")
    return spec.rpartition(":")[2] or spec


def _plugin_engine_case(spec: str, *, tie_tolerance: float | None, atol: float | None) -> EngineCase:
    factory = plugin_factory(spec, kind="engine")
    engine = factory()
    own_drafter = getattr(engine, "drafter", None)

    def make_engine() -> Any:
        """A fresh session: the instance reset (with its own drafter back), else a new one from the factory."""
        reset = getattr(engine, "reset", None)
        if not callable(reset):
            return factory()
        if hasattr(engine, "drafter"):
            engine.drafter = own_drafter
        reset()
        return engine

    live = getattr(engine, "target", None)
    oracle = getattr(engine, "oracle", None)
    greedy_fn = getattr(engine, "greedy", None)
    model = oracle if oracle is not None else live
    vocab = getattr(engine, "vocab_size", None)
    if vocab is None and model is not None:
        vocab = getattr(model, "vocab_size", None)
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        raise PluginError(f"--engine {spec!r}: the engine must expose vocab_size (an int) — docs/contract.md, engines")
    make_reference: Callable[[], Target] | None = None
    if model is not None and callable(getattr(model, "forward", None)):
        pristine = copy.deepcopy(model)

        def make_reference() -> Target:
            ref = copy.deepcopy(pristine)
            ref.reset()
            return ref  # type: ignore[no-any-return]

    if make_reference is None and not callable(greedy_fn):
        raise PluginError(
            f"--engine {spec!r}: the engine must expose an oracle of its model so its output can be compared with "
            "plain greedy: `oracle` (a Target of the same model), `target` (the live Target it decodes on) or "
            "`greedy(prompt, max_new_tokens) -> list[int]` — docs/contract.md, engines"
        )
    k = getattr(engine, "k", None)
    max_context = getattr(engine, "max_context", None) or getattr(model, "max_context", None)
    # an engine that declares its capabilities takes the suite's drafts only with `suite_drafts`;
    # without it, it is judged on its own drafts (docs/contract.md, engines)
    takes = _settable(engine, "drafter") and takes_suite_drafts(engine)
    tie, tol = declared_tolerances(
        engine if hasattr(engine, "tie_tolerance") else model, tie_tolerance=tie_tolerance, atol=atol
    )
    return EngineCase(
        id=_case_id(spec, engine),
        kind="plugin",
        name=component_name(engine),
        rollback=getattr(engine, "rollback", None),
        engine=engine,
        make_engine=make_engine,
        build_engine=factory,
        k=k if isinstance(k, int) and not isinstance(k, bool) else None,
        vocab_size=vocab,
        max_context=int(max_context) if isinstance(max_context, int) else None,
        live_target=live,
        make_reference=make_reference,
        greedy_fn=greedy_fn if make_reference is None else None,
        takes_drafter=takes,
        own_drafter=getattr(engine, "drafter", None) if takes else None,
        tie_tolerance=tie,
        atol=tol,
    )


def _subject_feature_layers(case: EngineCase, dsub: DrafterSubject) -> tuple[int, ...] | None:
    """The ``--drafter`` subject's feature layers, for an engine that reports features by layer
    (``feature_layers``: a wire engine's handshake, None without the capability ``features``).

    A layer the engine does not report is a usage error naming it (nothing is run)."""
    engine = case.engine
    if not hasattr(engine, "feature_layers") or feature_layers_of(case.own_drafter) is not None:
        return None
    layers = feature_layers_of(dsub.make())
    offered = getattr(engine, "feature_layers", None)
    if layers is not None and offered is not None:
        missing = [layer for layer in layers if layer not in offered]
        if missing:
            raise PluginError(
                f"--drafter {dsub.spec!r} reads the features of layer {missing[0]}, which engine {case.id} does not "
                f"report (its feature_layers: {list(offered)}; docs/protocol.md, Features)"
            )
    return layers


@attrs.define
class Suite:
    """Resolved subjects for one certification run."""

    subject: SubjectKind
    target: TargetSubject | None
    drafter: DrafterSubject | None
    engines: list[EngineCase]
    certify_drafter: bool
    certify_target: bool

    @classmethod
    def from_specs(
        cls,
        subject: SubjectKind = "all",
        *,
        drafter: str | None = None,
        target: str | None = None,
        engine: str | None = None,
        tie_tolerance: float | None = None,
        atol: float | None = None,
        oracle: str | None = None,
    ) -> Suite:
        if subject not in ("drafter", "target", "engine", "all"):
            raise PluginError(f"unknown subject {subject!r}; choose drafter, target, engine or all")
        if subject == "engine" and engine is None and (drafter or target):
            pass  # the built-in engine on the given drafter/target
        engines: list[EngineCase] = []
        tsub: TargetSubject | None = None
        dsub: DrafterSubject | None = None
        if engine is not None:
            engines.append(_plugin_engine_case(engine, tie_tolerance=tie_tolerance, atol=atol))
        if engine is None or target is not None or drafter is not None:
            dsub = DrafterSubject.from_spec(drafter or "ngram")
            if engines and drafter:
                try:
                    engines[0].feature_layers = _subject_feature_layers(engines[0], dsub)
                except PluginError:
                    close = getattr(engines[0].engine, "close", None)
                    if callable(close):
                        close()  # an engine process started for nothing is not left running
                    raise
            # a feature drafter is certified on the target whose features it reads, unless --target says otherwise
            feature_spec = getattr(dsub.make(), "feature_target_spec", None) if drafter else None
            default = feature_spec if isinstance(feature_spec, str) and feature_spec else DEFAULT_TARGET
            tsub = TargetSubject.from_spec(target or default, tie_tolerance=tie_tolerance, atol=atol, oracle=oracle)
            if subject in ("all", "engine", "drafter", "target") and engine is None:
                rollbacks = ["checkpoint", "replay"] if tsub.has_checkpoints else ["replay"]
                for rb in rollbacks:
                    engines.append(
                        EngineCase(
                            id=rb,
                            kind="builtin",
                            rollback=rb,
                            vocab_size=tsub.vocab_size,
                            max_context=tsub.max_context,
                            name=f"specproof.SpecDecoder(rollback={rb})",
                            tie_tolerance=tsub.tie_tolerance,
                            atol=tsub.atol,
                        )
                    )
        certify_drafter = dsub is not None and subject in ("drafter", "all")
        certify_target = tsub is not None and subject in ("target", "all")
        return cls(
            subject=subject,
            target=tsub,
            drafter=dsub,
            engines=engines,
            certify_drafter=certify_drafter,
            certify_target=certify_target,
        )
