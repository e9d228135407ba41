"""Stand-ins for devices without streams or events (CPU): same API, synchronous semantics, and
the stream and event methods of an accelerator built on stand-ins (:class:`StandInStreams`)."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any


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

    def __exit__(self, *exc: object) -> None:
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


class StandInStreams:
    """An accelerator's stream and event methods when its streams are stand-ins: every stream is
    a new ``stream_type()``, every event an ``event_type(enable_timing)``, and entering a stream
    changes nothing."""

    stream_type: Any = NullStream
    event_type: Any = HostEvent

    def stream(self, stream: Any) -> AbstractContextManager[Any]:
        return nullcontext(stream)

    def current_stream(self, index: int | None = None) -> Any:
        return self.stream_type()

    def default_stream(self, index: int | None = None) -> Any:
        return self.stream_type()

    def new_stream(self) -> Any:
        return self.stream_type()

    def new_event(self, enable_timing: bool = False) -> Any:
        return self.event_type(enable_timing)
