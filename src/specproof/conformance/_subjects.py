"""What is being certified: the subjects resolved from specs, and how to make fresh copies.

``Suite.from_specs`` follows DESIGN.md: a drafter subject runs under the built-in
engine on the chosen target; a target subject gets the target invariants and then
the built-in engine on it; an engine subject is white-box (its Generation has
steps) or black-box (``vocab_size`` plus ``target`` or ``greedy``).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from typing import Literal

import attrs

from specproof.engine import (
    Drafter,
    Engine,
    NgramDrafter,
    Target,
    greedy_with_margins,
    load_target,
    resolve_plugin,
)
from specproof.engine._plugins import plugin_factory
from specproof.engine._validate import component_name
from specproof.engine.errors import PluginError

__all__ = ["DEFAULT_TARGET", "DrafterSubject", "EngineCase", "Suite", "TargetSubject"]

DEFAULT_TARGET = "reference"
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
    tolerance: float

    @classmethod
    def from_spec(cls, spec: str, *, tolerance: float | None = None) -> TargetSubject:
        proto = load_target(spec)
        make = _copier(proto, lambda: load_target(spec))

        def fresh() -> Target:
            t = make()
            t.reset()  # type: ignore[attr-defined]
            return t  # type: ignore[return-value]

        tol = tolerance if tolerance is not None else float(getattr(proto, "tie_tolerance", 0.0) or 0.0)
        return cls(spec=spec, prototype=proto, make=fresh, tolerance=tol)

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

    def describe(self) -> str:
        describe = getattr(self.prototype, "describe", None)
        return str(describe()) if callable(describe) else self.name


@attrs.define
class DrafterSubject:
    spec: str
    make: Callable[[], Drafter]
    name: str

    @classmethod
    def from_spec(cls, spec: str) -> DrafterSubject:
        if spec == "ngram":
            return cls(spec=spec, make=NgramDrafter, name=NgramDrafter().name)
        factory = plugin_factory(spec, kind="drafter")
        first = factory()
        if factory() is first:  # an instance plug-in: copies stand in for fresh drafters
            make = _copier(first, None)
        else:
            make = factory
        return cls(spec=spec, make=make, name=component_name(first))  # type: ignore[arg-type]


@attrs.define
class EngineCase:
    """One engine configuration to run the engine invariants on.

    ``builtin`` cases are SpecDecoder with a fixed rollback strategy, fed scripted
    drafts (to reach every rollback path) and the drafter subject's drafts;
    ``plugin`` cases are an Engine plug-in with its own drafter and k.
    """

    id: str
    kind: Literal["builtin", "plugin"]
    rollback: str | None = None
    engine: Engine | None = None
    k: int | None = None
    greedy: Callable[[Sequence[int], int, int | None], tuple[list[int], list[float] | None]] | None = None
    target: Target | None = None
    vocab_size: int = 0
    max_context: int | None = None
    name: str = ""
    # unique per case for the run cache (an id() can be reused once a case is freed)
    token: int = attrs.field(factory=itertools.count().__next__)


def _plugin_engine_case(spec: str) -> EngineCase:
    engine = resolve_plugin(spec, kind="engine")
    vocab = getattr(engine, "vocab_size", None)
    target = getattr(engine, "target", None)
    if vocab is None and target is not None:
        vocab = getattr(target, "vocab_size", None)
    if not isinstance(vocab, int):
        raise PluginError(
            f"--engine {spec!r}: the engine must expose vocab_size (an int) — DESIGN.md, black-box engines"
        )
    greedy_fn = getattr(engine, "greedy", None)
    if target is None and not callable(greedy_fn):
        raise PluginError(
            f"--engine {spec!r}: the engine must expose `target` (a Target of the same model) or "
            "`greedy(prompt, max_new_tokens) -> list[int]` so its output can be compared with plain greedy"
        )
    if target is not None:
        trusted = copy.deepcopy(target)

        def greedy(prompt: Sequence[int], n: int, eos: int | None) -> tuple[list[int], list[float] | None]:
            gen, margins = greedy_with_margins(trusted, prompt, n, eos_token_id=eos)
            return list(gen.tokens), margins
    else:

        def greedy(prompt: Sequence[int], n: int, eos: int | None) -> tuple[list[int], list[float] | None]:
            tokens = [int(t) for t in greedy_fn(list(prompt), n)]  # type: ignore[misc]
            if eos is not None and eos in tokens:
                tokens = tokens[: tokens.index(eos) + 1]
            return tokens, None

    k = getattr(engine, "k", None)
    return EngineCase(
        id=spec.rpartition(":")[2] or spec,
        kind="plugin",
        engine=engine,  # type: ignore[arg-type]
        k=k if isinstance(k, int) else None,
        rollback=getattr(engine, "rollback", None),
        greedy=greedy,
        target=target,
        vocab_size=vocab,
        max_context=getattr(target, "max_context", None)
        if target is not None
        else getattr(engine, "max_context", None),
        name=component_name(engine),
    )


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
        tolerance: float | None = None,
    ) -> Suite:
        if subject not in ("drafter", "target", "engine", "all"):
            raise PluginError(f"unknown subject {subject!r}; choose drafter, target, engine or all")
        if subject == "engine" and engine is None and (drafter or target):
            pass  # the built-in engine on the given drafter/target
        engines: list[EngineCase] = []
        tsub: TargetSubject | None = None
        dsub: DrafterSubject | None = None
        if engine is not None:
            engines.append(_plugin_engine_case(engine))
        if engine is None or target is not None or drafter is not None:
            tsub = TargetSubject.from_spec(target or DEFAULT_TARGET, tolerance=tolerance)
            dsub = DrafterSubject.from_spec(drafter or "ngram")
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
