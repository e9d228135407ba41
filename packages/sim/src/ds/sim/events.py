"""Streams and events of a simulated device, with CUDA's completion rules.

A simulated device runs one stream, and work queued on it is **not complete until the host waits
for it**: ``event.synchronize()`` completes that event and everything queued before it;
``stream.synchronize()``, ``accelerator.synchronize()`` and every blocking read of a device value
(``.item()``, ``.tolist()``, ``.cpu()``) complete everything queued so far. Each such wait is a host
sync, recorded with its call site on the active :class:`ds.sim.accelerator.SimDevice`. What CUDA
refuses before completion is an error here:

* ``start.elapsed_time(end)`` with either event not complete (CUDA: ``cudaErrorNotReady``);
* reading a host tensor a non-blocking device-to-host copy fills before the host waited for the
  copy (on a GPU the bytes may not be there yet; see :mod:`ds.sim._observer`).

``event.query()`` says whether the event is complete, without waiting; ``event.wait()`` and
``stream.wait_event()`` order device work and complete nothing for the host. An event recorded
while no simulated device is active is complete at once.
"""

from __future__ import annotations

import time
from typing import Any

from ds.accel.streams import NullStream
from ds.interfaces.errors import AcceleratorError


def _active() -> Any:
    from ds.sim.accelerator import active_device

    return active_device()


class SimStream(NullStream):
    """The simulated device's one stream: ``with stream:`` and stream-to-stream waits are
    accepted (one stream runs in order); waiting on it from the host is a host sync."""

    def synchronize(self) -> None:
        dev = _active()
        if dev is not None:
            dev.record_sync("stream.synchronize()")

    def query(self) -> bool:
        dev = _active()
        return dev is None or dev.obs.completed >= dev.obs.issued


class SimEvent:
    """A device event: complete once the host waited for it (see the module docstring)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None
        self._device: Any = None  # the SimDevice it was recorded on
        self._queued = 0  # its position in that device's queue

    def record(self, stream: object = None) -> None:
        self._t = time.perf_counter()
        self._device = _active()
        self._queued = self._device.obs.issue() if self._device is not None else 0

    def wait(self, stream: object = None) -> None:
        return None  # a stream waits on the event: device side, the host goes on

    def query(self) -> bool:
        """Complete (an unrecorded event is, as on CUDA)? Never waits."""
        return self._device is None or self._device.obs.completed >= self._queued

    def synchronize(self) -> None:
        """Wait on the host for this event (a host sync) and everything queued before it."""
        if self._device is not None:
            self._device.record_sync("event.synchronize()", self._queued)

    def elapsed_time(self, end: SimEvent) -> float:
        """Milliseconds between this event and ``end``, like torch.cuda.Event.elapsed_time:
        both must be recorded with timing and complete."""
        if not self.enable_timing or not end.enable_timing:
            raise ValueError("elapsed_time needs both events created with enable_timing=True")
        if self._t is None or end._t is None:
            raise ValueError("elapsed_time needs both events recorded first")
        if not (self.query() and end.query()):
            raise AcceleratorError(
                "elapsed_time of an event the device has not completed (CUDA: "
                "cudaErrorNotReady): wait for the later event first (end.synchronize() or "
                "accelerator.synchronize())"
            )
        return (end._t - self._t) * 1e3


__all__ = ["SimEvent", "SimStream"]
