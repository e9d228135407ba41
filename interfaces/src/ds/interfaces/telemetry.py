"""Telemetry events the engine publishes and monitors, the ledger and the gate consume."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StepMetrics:
    """One optimizer step as measured by the engine (seconds, bytes)."""

    step: int
    loss: float | None
    lr: float
    step_time_s: float
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    comm_s: float = 0.0  # time inside collectives
    allgather_stall_s: float = 0.0  # time compute waited on parameter gathers
    sync_wait_s: float = 0.0  # barriers / waits on other ranks
    offload_in_bytes: int = 0  # host/NVMe -> device bytes this step
    offload_out_bytes: int = 0
    offload_time_s: float = 0.0
    peak_device_bytes: int = 0
    peak_host_rss_bytes: int = 0
    nvme_buffer_bytes: int = 0
    allotted_device_bytes: int = 0
    host_memory_limit_bytes: int = 0  # the host memory this process may use (cgroup, else RAM)
    late_rank: int = -1  # the rank the others waited for at this step's collectives (-1: none)
    grad_norm: float | None = None
    overflow: bool = False
    loss_scale: float | None = None
    samples: int = 0  # samples in this step, all ranks
    global_samples: int = (
        0  # samples since the run began (restored on resume), this step's included
    )
    tokens: int = 0  # tokens in this step, all ranks (0 when the model takes no token ids)
    rank: int = 0
    world_size: int = 1
    # Pipeline parallelism: the step's measured idle share of stages x step time, the schedule's
    # formula (p - 1) / (v * m + p - 1), and each stage's compute seconds, in order (device
    # timing events on an asynchronous device, else the host clock).
    pipeline_bubble_fraction: float | None = None
    pipeline_bubble_formula: float | None = None
    stage_compute_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class CommEvent:
    op: str
    message_bytes: int
    latency_s: float
    group_size: int
    rank: int = 0
    wait_s: float | None = None  # the part of latency_s the caller spent blocked (exposed)


@dataclass(frozen=True)
class CheckpointEvent:
    kind: str  # "save" | "load" | "delete"
    directory: str
    tag: str
    step: int
    shard_sha256: dict[str, str] = field(default_factory=dict)
    manifest_sha256: str | None = None
    bytes_written: int = 0
    duration_s: float = 0.0


@dataclass(frozen=True)
class ConfigEvent:
    config: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


Event = StepMetrics | CommEvent | CheckpointEvent | ConfigEvent
Subscriber = Callable[[Any], None]


class EventBus:
    """Synchronous publish/subscribe hub; a failing subscriber never breaks training."""

    def __init__(self) -> None:
        self._subs: list[tuple[type | None, Subscriber]] = []
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []

    def subscribe(self, callback: Subscriber, event_type: type | None = None) -> None:
        with self._lock:
            self._subs.append((event_type, callback))

    def unsubscribe(self, callback: Subscriber) -> None:
        with self._lock:
            self._subs = [(t, c) for (t, c) in self._subs if c is not callback]

    def publish(self, event: Any) -> None:
        with self._lock:
            subs = list(self._subs)
        for event_type, callback in subs:
            if event_type is None or isinstance(event, event_type):
                try:
                    callback(event)
                except Exception as exc:  # reported, not raised: telemetry must not kill a run
                    self.errors.append(exc)
