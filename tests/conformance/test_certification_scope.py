"""Caches belong to one certification: a verdict never leaks into the next one in the same process.

The subject is a target whose ``restore`` leaves the conv state 1e-4 off: ``engine.state-restored``
fails it at ``atol=0`` and passes it at ``atol=0.5``. Before the caches were scoped, a strict
certification after a loose one reused the loose runs and passed.
"""

from __future__ import annotations

import numpy as np
import pytest

from specproof.conformance import Certification, Plan, parametrize_with_checks
from specproof.conformance.plugin import CERTIFICATION
from specproof.conformance.zoo import ZooTarget

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

SPEC = "test_certification_scope:RestoreConvOff"


class RestoreConvOff(ZooTarget):
    """Restores the snapshot, then nudges conv_state by 1e-4: right within a loose tolerance only."""

    def restore(self, snapshot: object) -> None:
        self.inner.restore(snapshot)
        self.inner._conv_state += np.float32(1e-4)


def _verdicts(atol: float) -> dict[str, str]:
    cert = Certification(Plan.create("target", target=SPEC, atol=atol, only=("engine.state-restored",)))
    items = cert.all_checks()
    assert items, "the plan selected no check"
    return {item.id: cert.run(item).status for item in items}


@pytest.mark.parametrize("order", [(0.5, 0.0), (0.0, 0.5)], ids=["strict-after-loose", "loose-after-strict"])
def test_each_certification_gets_its_own_verdict(order: tuple[float, float]) -> None:
    seen = {atol: _verdicts(atol) for atol in order}
    assert set(seen[0.0].values()) == {"fail"}, seen  # 1e-4 off is a failure of the exact gate
    assert set(seen[0.5].values()) == {"pass"}, seen  # and within a loose one


def test_each_certification_owns_its_caches() -> None:
    first = Certification(Plan.create("target", target=SPEC, atol=0.5, only=("engine.state-restored",)))
    second = Certification(Plan.create("target", target=SPEC, atol=0.0, only=("engine.state-restored",)))
    assert first.cache is not second.cache
    assert first.cache.judges is not second.cache.judges
    first.run(first.all_checks()[0])
    assert first.cache.runs and not second.cache.runs


def test_the_session_certification_lives_in_the_stash(pytestconfig: pytest.Config) -> None:
    """The plugin keeps its certification under a StashKey, not a private attribute of the config."""
    assert isinstance(CERTIFICATION, pytest.StashKey)
    assert not hasattr(pytestconfig, "_specproof_certification")


@parametrize_with_checks(subject="target", target=SPEC, atol=0.5, only=["engine.state-restored"])
def test_loose_decorator_passes(specproof_check: object) -> None:
    from specproof.conformance import check

    check(specproof_check)  # type: ignore[arg-type]


@parametrize_with_checks(subject="target", target=SPEC, atol=0.0, only=["engine.state-restored"])
def test_strict_decorator_after_the_loose_one_fails(specproof_check: object) -> None:
    from specproof.conformance import check
    from specproof.contract import ViolationError

    with pytest.raises(ViolationError, match=r"engine\.state-restored"):
        check(specproof_check)  # type: ignore[arg-type]


@pytest.mark.parametrize("cleared", [True, False], ids=["as-shipped", "never-cleared"])
def test_a_finished_certification_holds_no_runs_or_models(monkeypatch: pytest.MonkeyPatch, cleared: bool) -> None:
    """Hypothesis keeps the last 128 state-machine classes (lru_caches), and a machine class carried the
    run's judges, target factories and oracle closures: a process certifying again and again (a
    campaign worker) grew ~17 MB a round at quick. After a run its caches are empty and its machine
    classes carry no configuration. The never-cleared variant shows both checks can fail."""
    import gc

    import specproof.strategies
    from specproof.conformance._engine_runs import RunCache
    from specproof.conformance._pytest_run import certify

    if not cleared:
        monkeypatch.setattr(RunCache, "clear", lambda self: None)
        monkeypatch.setattr(specproof.strategies, "release_machine", lambda machine: None)

    def machine_classes() -> list[type]:
        gc.collect()
        found = (k for k in gc.get_objects() if isinstance(k, type) and k.__qualname__.endswith("<locals>.Counted"))
        return [k for k in found if "_config_names" in dir(k)]

    before = {id(k) for k in machine_classes()}  # (classes of other tests' runs are not this run's)
    plan = Plan.create("engine", only=("stateful.rollback-machine", "engine.session", "engine.lossless"))
    cert, report = certify(plan)
    assert report.verdict == "pass"
    held = {"runs": len(cert.cache.runs), "greedy": len(cert.cache.greedy), "models": len(cert.cache.judges._models)}
    configured = [
        (klass.__name__, name)
        for klass in machine_classes()
        if id(klass) not in before
        for base in klass.__mro__
        for name in vars(base).get("_config_names", ())
        if name.endswith("_config") and getattr(base, name) is not None
    ]
    if cleared:
        assert held == {"runs": 0, "greedy": 0, "models": 0}
        assert configured == []
    else:
        assert held["runs"] and held["models"], held  # what the run filled, had it been left there
        assert configured, "no machine class ran"
