"""The drivers: one module per kind of search, behind one protocol (docs/contract.md, "Drivers").

An invariant's registry entry names its driver (``driver="engine-case"``); ``DRIVERS`` maps
that name to the driver's class. Adding a kind of search is a new module here with a
``Driver`` subclass, one line below (or ``register_driver`` for a driver outside the
package), and the invariants whose entry names it.
"""

from __future__ import annotations

from specproof.conformance.drivers._batches import BatchDriver
from specproof.conformance.drivers._decode_state import DecodeStateDriver
from specproof.conformance.drivers._engine_cases import EngineCaseDriver
from specproof.conformance.drivers._examples import ExamplesDriver
from specproof.conformance.drivers._protocol import CheckItem, Driver, DriverContext, NotApplicable, require
from specproof.conformance.drivers._rollback_machine import RollbackMachineDriver
from specproof.conformance.drivers._sampling import SamplingDriver
from specproof.conformance.drivers._session_machine import SessionMachineDriver
from specproof.conformance.drivers._tree_sampling import TreeSamplingDriver
from specproof.conformance.drivers._trees import TreeDriver

__all__ = [
    "DRIVERS",
    "CheckItem",
    "Driver",
    "DriverContext",
    "NotApplicable",
    "driver_class",
    "register_driver",
    "require",
]

DRIVERS: dict[str, type[Driver]] = {
    ExamplesDriver.name: ExamplesDriver,
    EngineCaseDriver.name: EngineCaseDriver,
    RollbackMachineDriver.name: RollbackMachineDriver,
    SessionMachineDriver.name: SessionMachineDriver,
    SamplingDriver.name: SamplingDriver,
    BatchDriver.name: BatchDriver,
    DecodeStateDriver.name: DecodeStateDriver,
    TreeDriver.name: TreeDriver,
    TreeSamplingDriver.name: TreeSamplingDriver,
}
"""Driver name (an invariant's ``driver=``) -> the class that runs its checks."""


def register_driver(driver: type[Driver]) -> type[Driver]:
    """Register a driver under its ``name`` (usable as a class decorator); a taken name is an error."""
    if not driver.name:
        raise ValueError(f"{driver.__name__} has no name: set the class attribute `name`")
    if DRIVERS.get(driver.name, driver) is not driver:
        raise ValueError(f"a driver named {driver.name!r} is registered already ({DRIVERS[driver.name].__name__})")
    DRIVERS[driver.name] = driver
    return driver


def driver_class(name: str) -> type[Driver]:
    """The driver registered under ``name`` (an unknown name says which ones exist)."""
    try:
        return DRIVERS[name]
    except KeyError:
        raise ValueError(f"no driver {name!r}: the registered drivers are {sorted(DRIVERS)}") from None
