"""The readiness gate's inputs, measured: each step's StepMetrics completed with the comm layer's
timings, the host-offload time and the memory in use before any subscriber sees it.

What each field means here (docs/ledger.md, "What the gate measures"):

* ``allgather_stall_s`` and ``sync_wait_s``: the exposed wait (the time the caller was blocked:
  launch plus wait, not launch to completion, so an asynchronous collective that completed
  behind compute costs nothing) in parameter-gathering collectives (all-gathers, broadcasts,
  point-to-point parameter transfers) and gradient-synchronising ones (all-reduce,
  reduce-scatter, reduce, barrier), less the least any rank waited in them that step: the
  collectives' own cost is not a stall, waiting for a peer that arrives later is
  (:mod:`ds.monitor.peer_waits`). ``late_rank`` is the rank that waited least: the one the others
  waited for. Rank 0 compares (its assessment is the one recorded); the other ranks, and a run
  without a key-value store, report their own exposed wait, an upper bound.
* ``offload_time_s``: with optimizer or parameter offload on, the optimizer step's time less the
  exposed collective wait inside it: the host step and its device<->host copies (0 without
  offload).
* ``peak_device_bytes`` and ``allotted_device_bytes``: the accelerator's peak allocation and the
  device's memory; on the CPU, where the device is the host, the peak RSS and the host limit.
* ``host_memory_limit_bytes``: the host memory the process may use: its cgroup's limit when set,
  else the machine's (:mod:`ds.monitor.memory_limit`).
* ``nvme_buffer_bytes``: bytes of the swap files under the NVMe offload paths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ds.interfaces.logging import get_logger
from ds.interfaces.telemetry import CommEvent, EventBus, StepMetrics
from ds.monitor.memory_limit import host_memory_limit
from ds.monitor.peer_waits import PeerWaits

log = get_logger(__name__)

GATHER_OPS = frozenset(
    {
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "broadcast",
        "broadcast_object_list",
        "isend",
        "irecv",
        "send",
        "recv",
        "batch_isend_irecv",
        "scatter",
        "gather",
    }
)
SYNC_OPS = frozenset(
    {
        "all_reduce",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "barrier",
        "monitored_barrier",
    }
)


def _machine_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 0


def store_peer_waits() -> PeerWaits | None:
    """The cross-rank wait comparison over torch.distributed's store (None in a 1-rank run)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # a backend initialised without a store: own waits only
        return None
    rank = dist.get_rank()
    return PeerWaits(store, rank, dist.get_world_size(), compare=rank == 0)


def _dir_bytes(paths: Iterable[Path]) -> int:
    total = 0
    for root in paths:
        if not root.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):  # a swap file replaced while walking
                    total += os.stat(os.path.join(dirpath, name)).st_size
    return total


class SignalBus(EventBus):
    """An EventBus that completes each StepMetrics with the measured gate inputs.

    Subscribe :meth:`on_comm` to the communicator's CommEvents (``ds.comm.configure(event_bus=)``);
    ``publish`` then merges the step's totals into the engine's StepMetrics.
    """

    def __init__(
        self,
        *,
        accelerator: Any = None,
        device_index: int | None = None,
        offload: bool = False,
        nvme_paths: Iterable[str] = (),
        peers: PeerWaits | None = None,
    ) -> None:
        super().__init__()
        self.peers = peers
        # Read once: a cgroup's limit is set when the container starts.
        self.host_limit = host_memory_limit(_machine_memory())
        self.accelerator = accelerator
        self.device_index = device_index
        self.offload = offload
        self.nvme_paths = [Path(p) for p in nvme_paths if p]
        self._gather = 0.0
        self._sync = 0.0
        self._recent: list[tuple[float, float]] = []  # (completion time, exposed wait) this step
        self._comm_lock = threading.Lock()
        self.comm_bus = EventBus()
        self.comm_bus.subscribe(self.on_comm, CommEvent)

    def on_comm(self, event: CommEvent) -> None:
        wait = event.latency_s if event.wait_s is None else event.wait_s
        with self._comm_lock:
            self._recent.append((time.perf_counter(), wait))
            if event.op in GATHER_OPS:
                self._gather += wait
            elif event.op in SYNC_OPS:
                self._sync += wait

    def _take(self, since: float) -> tuple[float, float, float]:
        """(gather s, sync s, collective s that ended after ``since``), and reset."""
        with self._comm_lock:
            inside = sum(lat for t, lat in self._recent if t >= since)
            out = (self._gather, self._sync, inside)
            self._gather = self._sync = 0.0
            self._recent.clear()
        return out

    def _memory(self) -> tuple[int, int, int]:
        """(peak device bytes, device memory, host memory limit)."""
        host = self.host_limit
        acc = self.accelerator
        if acc is None:
            return 0, 0, host
        try:
            peak = int(acc.max_memory_allocated(self.device_index))
            total = int(acc.total_memory(self.device_index))
            on_host = acc.device(self.device_index).type == "cpu"
        except Exception:  # an accelerator without memory statistics reports none
            return 0, 0, host
        return peak, (host if on_host else total), host

    def _stalls(self, m: StepMetrics, gather: float, sync: float) -> tuple[float, float, int]:
        """(gather stall, sync stall, late rank): compared across ranks where possible."""
        peers = self.peers
        if peers is None:
            return gather, sync, -1
        try:
            peers.publish(m.step, gather, sync)
            c = peers.compare_previous(m.step)
        except Exception as exc:  # a store that went away must not stop training
            log.debug("peer wait exchange failed", error=str(exc))
            self.peers = None
            return gather, sync, -1
        if not peers.compare:
            return gather, sync, -1
        if c is None:
            return 0.0, 0.0, -1
        return c.gather_stall_s, c.sync_stall_s, c.late_rank

    def enrich(self, m: StepMetrics) -> StepMetrics:
        # The engine publishes as its optimizer step ends: collectives that completed within the
        # last ``optimizer_s`` seconds ran inside the step.
        gather, sync, in_step = self._take(time.perf_counter() - m.optimizer_s)
        gather_stall, sync_stall, late = self._stalls(m, gather, sync)
        peak, total, host = self._memory()
        changes: dict[str, Any] = {
            "allgather_stall_s": m.allgather_stall_s or gather_stall,
            "sync_wait_s": m.sync_wait_s or sync_stall,
            "late_rank": late if m.late_rank < 0 else m.late_rank,
            "peak_device_bytes": m.peak_device_bytes or peak,
            "allotted_device_bytes": m.allotted_device_bytes or total,
            "host_memory_limit_bytes": m.host_memory_limit_bytes or host,
        }
        if self.offload and not m.offload_time_s:
            # Collectives inside the step (clipping's norm, the stage 1-2 re-gather) are not offload.
            changes["offload_time_s"] = max(0.0, m.optimizer_s - in_step)
        if self.nvme_paths and not m.nvme_buffer_bytes:
            changes["nvme_buffer_bytes"] = _dir_bytes(self.nvme_paths)
        return dataclasses.replace(m, **changes)

    def publish(self, event: Any) -> None:
        if isinstance(event, StepMetrics):
            event = self.enrich(event)
        super().publish(event)
