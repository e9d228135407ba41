"""``deepspeed.monitor.monitor``: ``Monitor`` and ``MonitorMaster`` over ds's monitors.

A DeepSpeed monitor is built from its config section and writes only when that section is
enabled, on rank 0; ds's monitor class of the same back-end does the writing (each view is a
subclass of it, so ``isinstance`` against ds's class holds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ds.monitor.base import Monitor as _DsMonitor


def _rank() -> int:
    from ds import comm

    return comm.get_rank() if comm.is_initialized() else 0


class Monitor(_DsMonitor):
    """DeepSpeed's monitor base: ``Monitor(monitor_config)`` with ``enabled`` and
    ``write_events(event_list)``; the client opens only when the section is enabled on rank 0."""

    def __init__(self, monitor_config: Any) -> None:
        self.monitor_config = monitor_config
        section = monitor_config.model_dump() if hasattr(monitor_config, "model_dump") else dict(
            monitor_config
        )  # fmt: skip
        for key, value in section.items():
            setattr(self, key, value)
        self.enabled = bool(section.get("enabled", False))
        self._open = self.enabled and _rank() == 0
        if self._open:
            super().__init__(section, rank=0)  # ds's class opens its writer here
        else:
            _DsMonitor.__init__(self, section, rank=_rank())

    def write_events(self, event_list: Sequence[tuple[str, Any, int]]) -> None:
        if self._open:
            super().write_events(event_list)

    def flush(self) -> None:
        if self._open:
            super().flush()

    def close(self) -> None:
        if self._open:
            super().close()


class MonitorMaster(Monitor):
    """Every enabled monitor of a ``DeepSpeedMonitorConfig``, as ``tb_monitor``,
    ``wandb_monitor``, ``csv_monitor`` and ``comet_monitor`` (None when disabled)."""

    def __init__(self, monitor_config: Any) -> None:
        from ds.full.compat.deepspeed.monitor.comet import CometMonitor
        from ds.full.compat.deepspeed.monitor.csv_monitor import csvMonitor
        from ds.full.compat.deepspeed.monitor.tensorboard import TensorBoardMonitor
        from ds.full.compat.deepspeed.monitor.wandb import WandbMonitor

        _DsMonitor.__init__(self, {}, rank=_rank())
        self.monitor_config = monitor_config
        self.enabled = bool(monitor_config.enabled)
        rank0 = _rank() == 0
        c = monitor_config
        self.tb_monitor = (
            TensorBoardMonitor(c.tensorboard) if rank0 and c.tensorboard.enabled else None
        )
        self.wandb_monitor = WandbMonitor(c.wandb) if rank0 and c.wandb.enabled else None
        self.csv_monitor = csvMonitor(c.csv_monitor) if rank0 and c.csv_monitor.enabled else None
        self.comet_monitor = CometMonitor(c.comet) if rank0 and c.comet.enabled else None

    @property
    def monitors(self) -> list[Any]:
        found = (self.tb_monitor, self.wandb_monitor, self.csv_monitor, self.comet_monitor)
        return [m for m in found if m is not None]

    def write_events(self, event_list: Sequence[tuple[str, Any, int]]) -> None:
        for m in self.monitors:
            m.write_events(event_list)

    def flush(self) -> None:
        for m in self.monitors:
            m.flush()

    def close(self) -> None:
        for m in self.monitors:
            m.close()


__all__ = ["Monitor", "MonitorMaster"]
