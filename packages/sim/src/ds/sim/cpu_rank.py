"""A simulated CPU rank: the compute device is the host, so device and host are one memory.

A rank of a gloo job without a GPU trains host tensors: ds's engine, given the ``cpu``
accelerator, computes on ``cpu`` and takes its host routes. Where a GPU rank keeps two copies,
one on each side of a copy between host and device, a CPU rank keeps one, because the engine
makes no copy when source and destination are the same device: the optimizer steps the gradient
partitions themselves instead of host copies of them (``Stage3Optimizer._grad_for``), a shard
swapped in from NVMe or offloaded to the host is gathered where it lies instead of being copied
to the device (``collectives._on``), and an fp32 shard on the host is its own master. The
simulation therefore runs the rank as what it is, not as a GPU rank with the bytes adjusted
afterwards: a :class:`~ds.sim.accelerator.SimDevice` with ``host=True`` makes fake ``cpu``
tensors and books them in one pool, and :class:`SimCpuAccelerator` is the real ``cpu``
accelerator with its memory figures read from that pool instead of the process's RSS.

:func:`cpu_rank_state` installs both for one rank of a :class:`~ds.sim.comm.SimWorld` made with
``host_ranks=True`` (its communicator speaks gloo and takes host tensors): ``DS_ACCELERATOR=cpu``
and the ``cpu`` accelerator of the registry resolve to the simulated one while inside, so
``ds.full.initialize`` builds the engine as on a CPU node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from ds.accel.cpu import CpuAccelerator
from ds.sim._observer import DeviceStats
from ds.sim.accelerator import active_device
from ds.sim.comm import StrictCommunicator
from ds.sim.world import _process_state


class SimCpuAccelerator(CpuAccelerator):
    """``cpu`` with the simulated rank's bytes (the active ``SimDevice``) as its memory figures;
    everything else (no streams, no pinned memory, gloo) is the real CPU accelerator's."""

    def _stats(self) -> DeviceStats:
        dev = active_device()
        return dev.host_bytes() if dev is not None else DeviceStats()

    def memory_allocated(self, index: int | None = None) -> int:
        return self._stats().current

    def max_memory_allocated(self, index: int | None = None) -> int:
        return self._stats().peak

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        dev = active_device()
        if dev is not None:
            dev.reset_peak()

    def memory_reserved(self, index: int | None = None) -> int:
        return self.memory_allocated(index)

    def total_memory(self, index: int | None = None) -> int:
        dev = active_device()
        return dev.total_bytes if dev is not None else super().total_memory(index)

    def available_memory(self, index: int | None = None) -> int:
        return max(0, self.total_memory(index) - self.memory_allocated(index))

    def memory_stats(self, index: int | None = None) -> Mapping[str, int]:
        stats = self._stats()
        return {
            "allocated_bytes.all.current": stats.current,
            "allocated_bytes.all.peak": stats.peak,
            "total_bytes": self.total_memory(index),
            "available_bytes": self.available_memory(index),
        }


@contextlib.contextmanager
def cpu_rank_state(comm: StrictCommunicator, accel: SimCpuAccelerator) -> Iterator[None]:
    """While inside, this process is a CPU rank: ``comm`` is ``ds.comm``'s communicator and
    ``accel`` is what ``DS_ACCELERATOR=cpu`` resolves to."""
    from ds.interfaces import registry

    # registry.get returns the factory's result, which ds.full then calls: the same object.
    registry.register(registry.ACCELERATORS, "cpu", lambda: lambda: accel)
    try:
        with _process_state(comm, accel, "cpu"):
            yield
    finally:
        registry.unregister(registry.ACCELERATORS, "cpu")


__all__ = ["SimCpuAccelerator", "cpu_rank_state"]
