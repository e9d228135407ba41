"""The instrumented path of every collective: timing, timeout watchdog, consistency checks.

A :class:`Tap` exists only while at least one of these is switched on, so the plain path of
:class:`~ds.comm.backends.torch_backend.TorchCommunicator` pays nothing for them.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as _dist

from ds.comm._handle import as_timedelta
from ds.interfaces.errors import CollectiveTimeoutError, CommError

if TYPE_CHECKING:
    from ds.comm.comms_logger import CommsLogger
    from ds.comm.watchdog import Token, Watchdog
    from ds.interfaces.telemetry import EventBus

_perf = time.perf_counter


@dataclass(eq=False)
class Tap:
    """What runs around a collective when any instrumentation is on."""

    logger: CommsLogger | None = None
    watchdog: Watchdog | None = None
    check_consistency: bool = False
    event_bus: EventBus | None = None
    _local: threading.local = field(default_factory=threading.local, init=False, repr=False)

    # A per-thread override set by ds.comm.collective_timeout().
    @property
    def timeout_override(self) -> float | None:
        return getattr(self._local, "timeout", None)

    @timeout_override.setter
    def timeout_override(self, value: float | None) -> None:
        self._local.timeout = value

    def is_idle(self) -> bool:
        return (
            self.logger is None
            and self.watchdog is None
            and not self.check_consistency
            and self.event_bus is None
        )

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()

    def _records(self, name: str) -> bool:
        lg = self.logger
        return (lg is not None and lg.wants(name)) or self.event_bus is not None

    def run(
        self,
        name: str,
        nbytes: int,
        group: Any,
        async_op: bool,
        call: Callable[[bool], Any],
        tensors: tuple[torch.Tensor, ...],
        after: Callable[[], None] | None,
        same_shape: bool,
        timeout: float | None = None,
    ) -> TapHandle | None:
        if group is not None and _dist.get_rank(group) < 0:
            # Not a member: torch makes the call a no-op; nothing to time, guard or check.
            call(async_op)
            return None
        if self.check_consistency:
            from ds.comm.consistency import check_consistency

            check_consistency(name, tensors, group, same_shape)
        wd = self.watchdog
        limit = timeout if timeout is not None else self.timeout_override
        if wd is not None and limit is None:
            limit = wd.timeout_s
        token = wd.enter(name, nbytes, group) if wd is not None else None
        timed = self._records(name)
        t0 = _perf()
        if limit is None:
            work = call(async_op)
            if async_op and work is not None:
                return TapHandle(self, work, after, name, nbytes, group, t0, token, None, timed)
            if after is not None:
                after()
            if timed:
                latency = _perf() - t0
                self.record(name, nbytes, group, latency, latency)
            return None
        work = call(True)
        if work is None:  # this rank is not part of the group
            if token is not None and wd is not None:
                wd.leave(token)
            return None
        handle = TapHandle(self, work, after, name, nbytes, group, t0, token, limit, timed)
        if async_op:
            return handle
        handle.wait()
        return None

    def run_p2p(
        self, name: str, tensor: torch.Tensor, peer: int, call: Callable[[], Any]
    ) -> TapHandle:
        wd = self.watchdog
        limit = self.timeout_override
        if wd is not None and limit is None:
            limit = wd.timeout_s
        nbytes = tensor.numel() * tensor.element_size()
        timed = self._records(name)
        work = call()
        return TapHandle(
            self, work, None, name, nbytes, None, _perf(), None, limit, timed, _peer=peer
        )

    def record(
        self, name: str, nbytes: int, group: Any, latency_s: float, wait_s: float | None = None
    ) -> None:
        """``latency_s``: launch to completion; ``wait_s``: the part the caller was blocked in
        (the launch and the wait), which is what a collective costs the step."""
        from ds.comm._groups import group_size

        size = group_size(group)
        lg = self.logger
        if lg is not None and lg.wants(name):
            lg.record(name, nbytes, latency_s, size)
        bus = self.event_bus
        if bus is not None:
            from ds.comm._groups import global_rank
            from ds.interfaces.telemetry import CommEvent

            bus.publish(CommEvent(name, nbytes, latency_s, size, global_rank(), wait_s))


@dataclass(slots=True, eq=False, repr=False)
class TapHandle:
    """Async handle of an instrumented collective: bounded wait, then timing and post-work."""

    _tap: Tap
    _work: Any
    _after: Callable[[], None] | None
    _name: str
    _nbytes: int
    _group: Any
    _t0: float
    _token: Token | None
    _limit: float | None
    _timed: bool
    _peer: int | None = None
    _done: bool = field(default=False, init=False)
    _launch_s: float = field(init=False)

    def __post_init__(self) -> None:
        self._launch_s = _perf() - self._t0  # the caller was blocked in the launch, too

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        if self._done:
            return True
        limit: float | None
        if timeout is not None:
            limit = as_timedelta(timeout).total_seconds()
        else:
            limit = self._limit
        wd = self._tap.watchdog
        w0 = _perf()
        try:
            if limit is None:
                self._work.wait()
            else:
                self._work.wait(datetime.timedelta(seconds=limit))
        except RuntimeError as exc:
            now = _perf()
            waited = now - self._t0
            timed_out = limit is not None and now - w0 >= 0.9 * limit
            if timed_out:
                # The backend still holds the collective; releasing the group would join it.
                from ds.comm._abandon import abandon

                abandon(self._group, self._name)
            if timed_out and wd is not None and self._token is not None:
                raise wd.timeout_error(self._token, waited, exc) from exc
            target = f" with rank {self._peer}" if self._peer is not None else ""
            if timed_out:
                raise self._timeout_without_watchdog(waited, target) from exc
            # Not a timeout: the backend failed (typically a peer process died).
            from ds.comm._format import fmt_bytes
            from ds.comm._groups import group_label

            where = f" on group {group_label(self._group)}" if self._peer is None else target
            raise CommError(
                f"{self._name}({fmt_bytes(self._nbytes)}){where} failed after {waited:.1f} s: "
                f"{exc}. A peer process may have exited; check the other ranks' logs"
            ) from exc
        finally:
            if wd is not None and self._token is not None:
                wd.leave(self._token)
        self._done = True
        after, self._after = self._after, None
        if after is not None:
            after()
        if self._timed:
            now = _perf()
            exposed = self._launch_s + now - w0
            self._tap.record(self._name, self._nbytes, self._group, now - self._t0, exposed)
        return True

    def _timeout_without_watchdog(self, waited: float, target: str) -> CollectiveTimeoutError:
        from ds.comm._format import fmt_bytes
        from ds.comm._groups import global_rank, group_label

        missing = (
            str(self._peer)
            if self._peer is not None
            else "unknown (enable the watchdog: ds.comm.configure(watchdog=True) names them)"
        )
        return CollectiveTimeoutError(
            f"rank {global_rank()} waited {waited:.1f} s in {self._name}{target}"
            f"({fmt_bytes(self._nbytes)}) on group {group_label(self._group)}; ranks missing: "
            f"{missing}"
        )

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)
