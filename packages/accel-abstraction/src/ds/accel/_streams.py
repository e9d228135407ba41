"""Stand-ins for devices without streams or events (CPU): same API, synchronous semantics."""

from __future__ import annotations

import time
from types import TracebackType


class NullStream:
    """A stream on a synchronous device: work is complete when the call returns."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, other: object) -> None:
        return None

    def wait_event(self, event: object) -> None:
        return None

    def query(self) -> bool:
        return True

    def __enter__(self) -> NullStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class HostEvent:
    """An event on a synchronous device; with timing enabled it records wall-clock time."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: object = None) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def wait(self, stream: object = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: HostEvent) -> float:
        """Milliseconds between this event and ``end``, like torch.cuda.Event.elapsed_time."""
        if not self.enable_timing or not end.enable_timing:
            raise ValueError("elapsed_time needs both events created with enable_timing=True")
        if self._t is None or end._t is None:
            raise ValueError("elapsed_time needs both events recorded first")
        return (end._t - self._t) * 1e3
