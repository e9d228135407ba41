"""Streams and events of a simulated device.

A simulated device runs one stream, and the host never waits for it except where the code asks
it to: a host wait (``event.synchronize()``, ``stream.synchronize()``) is recorded as a host sync
of the active :class:`ds.sim.accelerator.SimDevice`.
"""

from __future__ import annotations

import time
from typing import Any


def _active() -> Any:
    from ds.sim.accelerator import active_device

    return active_device()


def _host_wait(what: str) -> None:
    dev = _active()
    if dev is not None:
        dev.record_sync(what)


class SimStream:
    """The simulated device's one stream: ``with stream:`` and stream-to-stream waits are
    accepted (one stream runs in order); waiting on it from the host is a host sync."""

    def synchronize(self) -> None:
        _host_wait("stream.synchronize()")

    def wait_stream(self, other: object) -> None:
        return None

    def wait_event(self, event: object) -> None:
        return None

    def query(self) -> bool:
        return True

    def __enter__(self) -> SimStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class SimEvent:
    """A device event; waiting on it from the host is a host sync and is recorded as one."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: object = None) -> None:
        self._t = time.perf_counter()

    def wait(self, stream: object = None) -> None:
        return None  # a stream waits on the event: device side, the host goes on

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _host_wait("event.synchronize()")

    def elapsed_time(self, end: SimEvent) -> float:
        """Milliseconds between this event and ``end``, like torch.cuda.Event.elapsed_time."""
        if not self.enable_timing or not end.enable_timing:
            raise ValueError("elapsed_time needs both events created with enable_timing=True")
        if self._t is None or end._t is None:
            raise ValueError("elapsed_time needs both events recorded first")
        # CUDA requires both events complete; reading the time waits for them.
        self.synchronize()
        return (end._t - self._t) * 1e3


__all__ = ["SimEvent", "SimStream"]
