"""Run a program on a simulated GPU world: N ranks, each on its own fake ``cuda:local_rank``.

``run_world(fn, world_size=8)`` runs ``fn(ctx)`` once per rank, one rank after another (see
:mod:`ds.sim.comm` for why), each inside:

* a :class:`ds.sim.accelerator.SimDevice` (fake CUDA tensors; placement errors raise; host syncs and
  per-device memory recorded),
* a fake process group of the world's size with that rank's :class:`StrictCommunicator` (device
  tensors only, on the rank's device), installed as ``ds.comm``'s communicator,
* ``DS_ACCELERATOR=simgpu`` and ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``, so ``ds.full.initialize``
  binds the rank's device and builds the engine as on a GPU node. The rank starts with ``cuda:0``
  current, as a new process does: selecting ``cuda:local_rank`` (``set_device``) is the code's
  own job, and a rank that skips it fails its first collective.

After the last rank, the ranks' collective traces are replayed together
(:meth:`SimWorld.check`): different collectives, sizes or orders on two ranks, mismatched sends,
or a deadlocking order raise ``CommError``. The result holds each rank's return value, peak and
final device and host bytes, host syncs and communication bytes.

Example (what tests/simgpu does)::

    def train(ctx):
        model = build_model()                 # on the CPU; initialize() moves it to ctx.device
        engine, *_ = ds.initialize(model=model, config=cfg)
        ...
        return engine.global_steps

    result = run_world(train, world_size=8)
    result.ranks[3].device_peak, result.ranks[3].host_syncs
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ds.interfaces.comm import NCCL_CAPABILITIES, CommCapabilities
from ds.sim.accelerator import DEFAULT_DEVICE_BYTES, HostSync, SimDevice, SimGpuAccelerator
from ds.sim.comm import SimWorld, StrictCommunicator


@dataclass
class RankContext:
    """What ``fn`` receives for one rank."""

    rank: int
    world_size: int
    comm: StrictCommunicator
    sim: SimDevice
    accelerator: SimGpuAccelerator
    world: SimWorld

    @property
    def device(self) -> torch.device:
        return self.sim.device


@dataclass
class RankResult:
    rank: int
    value: Any
    device_peak: int
    device_final: int
    host_peak: int
    host_final: int
    host_syncs: list[HostSync] = field(default_factory=list)
    traffic: dict[str, int] = field(default_factory=dict)
    copies: dict[str, int] = field(default_factory=dict)


@dataclass
class WorldResult:
    world: SimWorld
    ranks: list[RankResult]

    def values(self) -> list[Any]:
        return [r.value for r in self.ranks]


@contextlib.contextmanager
def sim_kernels() -> Iterator[None]:
    """While inside, the ``cpu`` and ``cuda`` kernel providers are the simulated ones
    (:mod:`ds.sim.kernels`: native kernels cannot walk fake tensors)."""
    from ds.interfaces import registry
    from ds.sim.kernels import SimKernels

    for kind in ("cpu", "cuda"):
        # registry.get returns the factory's result, which ds.full then calls.
        registry.register(
            registry.KERNELS, kind, lambda kind=kind: functools.partial(SimKernels, kind)
        )
    try:
        yield
    finally:
        for kind in ("cpu", "cuda"):
            registry.unregister(registry.KERNELS, kind)


@contextlib.contextmanager
def sim_checkpoints() -> Iterator[None]:
    """While inside, the ``default`` checkpoint engine is the simulated one
    (:mod:`ds.sim.checkpoint`), one store shared by the world's ranks."""
    from ds.interfaces import registry
    from ds.sim.checkpoint import SimCheckpointEngine, SimCheckpointStore

    store = SimCheckpointStore()
    registry.register(
        registry.CHECKPOINT_ENGINES,
        "default",
        lambda: functools.partial(SimCheckpointEngine, store),
    )
    try:
        yield
    finally:
        registry.unregister(registry.CHECKPOINT_ENGINES, "default")


@contextlib.contextmanager
def _process_state(comm: StrictCommunicator, accel: Any, name: str = "simgpu") -> Iterator[None]:
    """``comm`` and ``accel`` are the process's communicator and accelerator, and
    ``DS_ACCELERATOR`` names ``accel`` (``simgpu``, or ``cpu`` for a CPU rank)."""
    from ds import accel as accel_mod
    from ds import comm as comm_mod

    previous_comm = comm_mod.get_communicator()
    previous_env = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = name
    comm_mod.set_communicator(comm)
    accel_mod.set_accelerator(accel)
    try:
        yield
    finally:
        comm_mod.set_communicator(previous_comm)
        accel_mod.reset_accelerator()
        if previous_env is None:
            os.environ.pop("DS_ACCELERATOR", None)
        else:
            os.environ["DS_ACCELERATOR"] = previous_env


def run_world(
    fn: Callable[[RankContext], Any],
    world_size: int = 8,
    *,
    local_size: int | None = None,
    capabilities: CommCapabilities = NCCL_CAPABILITIES,
    device_bytes: int = DEFAULT_DEVICE_BYTES,
    check: bool = True,
) -> WorldResult:
    """Run ``fn`` on every rank of a simulated world and check the ranks' collectives agree."""
    world = SimWorld(world_size, local_size, capabilities)
    results: list[RankResult] = []
    # Each rank ends with a collection and each memory census walks the heap: freezing what
    # exists before the world starts keeps both to the objects the ranks make (in a test
    # process the rest of the heap is millions of objects and most of a run's time).
    gc.freeze()
    try:
        with sim_kernels(), sim_checkpoints():
            for rank in range(world_size):
                results.append(_run_rank(fn, world, rank, device_bytes))
    finally:
        gc.unfreeze()
    if check:
        world.check()
    return WorldResult(world, results)


def _run_rank(
    fn: Callable[[RankContext], Any], world: SimWorld, rank: int, device_bytes: int
) -> RankResult:
    sim = SimDevice(world.local_rank(rank), device_bytes, selected=False)
    accel = SimGpuAccelerator()
    with world.rank(rank) as comm, sim, _process_state(comm, accel):
        value = fn(RankContext(rank, world.world_size, comm, sim, accel, world))
        memory = sim.memory()
    # The rank's engine, hooks and modules form reference cycles; free them before the next
    # rank so ranks do not pile up in memory.
    gc.collect()
    dev = memory.get(str(sim.device))
    host = memory.get("cpu")
    return RankResult(
        rank,
        value,
        dev.peak if dev else 0,
        dev.current if dev else 0,
        host.peak if host else 0,
        host.current if host else 0,
        list(sim.host_syncs),
        world.traffic(rank),
        sim.copies,
    )


__all__ = ["RankContext", "RankResult", "WorldResult", "run_world"]
