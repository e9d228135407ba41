"""The readiness gate's inputs, measured: each step's StepMetrics completed with the comm layer's
timings, the host-offload time and the memory in use before any subscriber sees it.

What each field means here (docs/ledger.md, "What the gate measures"):

* ``allgather_stall_s``: seconds inside parameter-gathering collectives this step (all-gathers,
  broadcasts, point-to-point parameter transfers), launch to completion, as ds.comm times them.
* ``sync_wait_s``: seconds inside gradient-synchronising collectives (all-reduce,
  reduce-scatter, reduce, barrier).
* ``offload_time_s``: with optimizer or parameter offload on, the optimizer step's time less the
  collectives inside it: the host step and its device<->host copies (0 without offload).
* ``peak_device_bytes`` and ``allotted_device_bytes``: the accelerator's peak allocation and the
  device's total memory (on the CPU, the process's peak RSS and the machine's memory).
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

from ds.interfaces.telemetry import CommEvent, EventBus, StepMetrics

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
    ) -> None:
        super().__init__()
        self.accelerator = accelerator
        self.device_index = device_index
        self.offload = offload
        self.nvme_paths = [Path(p) for p in nvme_paths if p]
        self._gather = 0.0
        self._sync = 0.0
        self._recent: list[tuple[float, float]] = []  # (arrival time, latency) this step
        self._comm_lock = threading.Lock()
        self.comm_bus = EventBus()
        self.comm_bus.subscribe(self.on_comm, CommEvent)

    def on_comm(self, event: CommEvent) -> None:
        with self._comm_lock:
            self._recent.append((time.perf_counter(), event.latency_s))
            if event.op in GATHER_OPS:
                self._gather += event.latency_s
            elif event.op in SYNC_OPS:
                self._sync += event.latency_s

    def _take(self, since: float) -> tuple[float, float, float]:
        """(gather s, sync s, collective s that ended after ``since``), and reset."""
        with self._comm_lock:
            inside = sum(lat for t, lat in self._recent if t >= since)
            out = (self._gather, self._sync, inside)
            self._gather = self._sync = 0.0
            self._recent.clear()
        return out

    def _memory(self) -> tuple[int, int]:
        acc = self.accelerator
        if acc is None:
            return 0, 0
        try:
            return (
                int(acc.max_memory_allocated(self.device_index)),
                int(acc.total_memory(self.device_index)),
            )
        except Exception:  # an accelerator without memory statistics reports none
            return 0, 0

    def enrich(self, m: StepMetrics) -> StepMetrics:
        # The engine publishes as its optimizer step ends: collectives that completed within the
        # last ``optimizer_s`` seconds ran inside the step.
        gather, sync, in_step = self._take(time.perf_counter() - m.optimizer_s)
        peak, total = self._memory()
        changes: dict[str, Any] = {
            "allgather_stall_s": m.allgather_stall_s or gather,
            "sync_wait_s": m.sync_wait_s or sync,
            "peak_device_bytes": m.peak_device_bytes or peak,
            "allotted_device_bytes": m.allotted_device_bytes or total,
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


def signal_bus_for(cfg: Any, accelerator: Any, device: Any) -> SignalBus:
    """The bus for a run of ``cfg`` on ``device``, its comm timings switched on in ds.comm."""
    zero = cfg.zero_optimization
    offload = zero.offload_optimizer_device in ("cpu", "nvme") or zero.offload_param_device in (
        "cpu",
        "nvme",
    )
    nvme = []
    for section in (getattr(zero, "offload_optimizer", None), getattr(zero, "offload_param", None)):
        path = getattr(section, "nvme_path", None) if section is not None else None
        if path and getattr(section, "device", None) == "nvme":
            nvme.append(str(path))
    index = getattr(device, "index", None)
    bus = SignalBus(accelerator=accelerator, device_index=index, offload=offload, nvme_paths=nvme)
    from ds import comm

    comm.configure(event_bus=bus.comm_bus)
    return bus
