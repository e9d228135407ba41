"""Plug-in registry over Python entry points.

Implementations advertise themselves in ``[project.entry-points."<group>"]`` tables; consumers
look them up by group and name. Discovery is lazy (nothing is loaded until asked for) and cached.
A missing provider raises :class:`ProviderNotFoundError` naming the distribution that provides it.

Command-line verbs (group ``ds.cli``): the launcher owns the ``ds`` console script and discovers
verbs other distributions register. An entry point's name is the verb path joined by dots
(``bench.comm`` serves ``ds bench comm``; ``checkpoint`` serves ``ds checkpoint ...``); its value is
a callable ``main(argv: list[str]) -> int`` that receives the arguments after the verb path and
returns the process exit code. The longest registered verb path wins.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ds.interfaces.errors import ProviderNotFoundError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

# Entry-point groups used across ds.
ACCELERATORS = "ds.accelerators"
COMM_BACKENDS = "ds.comm_backends"
KERNELS = "ds.kernels"
CHECKPOINT_ENGINES = "ds.checkpoint_engines"
LEDGERS = "ds.ledgers"
GATES = "ds.gates"
RUNNERS = "ds.runners"
ENGINES = "ds.engines"
INFERENCE_MODELS = "ds.inference_models"
MONITORS = "ds.monitors"
CLI = "ds.cli"
# The composition root's entry points for framework adapters: "default" is ``initialize`` and
# the ZeRO-3 helpers sit beside it ("zero_init", "gathered_parameters", ...).
INITIALIZE = "ds.initialize"
# The simulated GPU world's services for planning tools ("memory": per-rank memory of a config).
SIMULATIONS = "ds.simulations"

# Which distribution provides the built-in implementation of each group, used to tell a user
# what to install when a lookup fails.
PROVIDING_DISTRIBUTION: dict[str, str] = {
    ACCELERATORS: "ds-accel-abstraction",
    COMM_BACKENDS: "ds-comm",
    KERNELS: "ds-ops-kernels",
    CHECKPOINT_ENGINES: "ds-checkpoint-ledger",
    LEDGERS: "ds-checkpoint-ledger",
    GATES: "ds-checkpoint-ledger",
    RUNNERS: "ds-launcher",
    ENGINES: "ds-zero-runtime",
    INFERENCE_MODELS: "ds-inference-v2",
    MONITORS: "ds-monitor",
    CLI: "ds-launcher",
    INITIALIZE: "ds-full",
    SIMULATIONS: "ds-sim",
}


@dataclass(frozen=True)
class Provider:
    """One registered implementation: ``group``/``name`` -> ``value`` ("module:attr")."""

    group: str
    name: str
    value: str
    distribution: str | None

    def load(self) -> Any:
        return _load(self.group, self.name)


# Objects registered at run time (tests, plug-ins without packaging metadata).
_runtime: dict[tuple[str, str], Callable[[], Any]] = {}


@functools.cache
def _group(group: str) -> tuple[EntryPoint, ...]:
    # importlib.metadata costs ~30 ms to import: pay it only when a lookup happens.
    from importlib.metadata import entry_points

    return tuple(entry_points(group=group))


@functools.cache
def _load(group: str, name: str) -> Any:
    for ep in _group(group):
        if ep.name == name:
            return ep.load()
    raise _missing(group, name)


def _missing(group: str, name: str) -> ProviderNotFoundError:
    known = sorted(list_providers(group))
    dist = PROVIDING_DISTRIBUTION.get(group)
    hint = (
        f"install the distribution that provides it (pip install {dist})"
        if dist
        else ("install the distribution that provides it")
    )
    avail = ", ".join(known) if known else "none"
    return ProviderNotFoundError(
        f"no provider named {name!r} in group {group!r} (available: {avail}); {hint}"
    )


def list_providers(group: str) -> dict[str, Provider]:
    """All providers registered for ``group``, by name, without loading any of them."""
    out: dict[str, Provider] = {}
    for ep in _group(group):
        dist = ep.dist.name if ep.dist is not None else None
        out[ep.name] = Provider(group, ep.name, ep.value, dist)
    for (g, n), _factory in _runtime.items():
        if g == group:
            out[n] = Provider(group, n, "<runtime>", None)
    return out


def has_provider(group: str, name: str) -> bool:
    return name in list_providers(group)


def get(group: str, name: str) -> Any:
    """Load and return the object registered as ``name`` in ``group``.

    Raises ProviderNotFoundError naming the distribution to install when nothing provides it.
    """
    factory = _runtime.get((group, name))
    if factory is not None:
        return factory()
    return _load(group, name)


def register(group: str, name: str, factory: Callable[[], Any]) -> None:
    """Register a provider at run time (``factory()`` returns the object ``get`` gives back)."""
    _runtime[(group, name)] = factory


def unregister(group: str, name: str) -> None:
    _runtime.pop((group, name), None)


def refresh() -> None:
    """Forget cached discovery results (after installing a distribution at run time)."""
    _group.cache_clear()
    _load.cache_clear()


__all__ = [
    "ACCELERATORS",
    "CHECKPOINT_ENGINES",
    "CLI",
    "COMM_BACKENDS",
    "ENGINES",
    "GATES",
    "INFERENCE_MODELS",
    "INITIALIZE",
    "KERNELS",
    "LEDGERS",
    "MONITORS",
    "PROVIDING_DISTRIBUTION",
    "RUNNERS",
    "Provider",
    "get",
    "has_provider",
    "list_providers",
    "refresh",
    "register",
    "unregister",
]
