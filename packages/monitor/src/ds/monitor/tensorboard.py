"""The ``tensorboard`` block: scalar events in ``<output_path>/<job_name>``, as DeepSpeed writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ds.monitor.base import Monitor, MonitorEvent, output_dir, require


class TensorBoardMonitor(Monitor):
    block = "tensorboard"

    def __init__(self, section: Mapping[str, Any], *, rank: int = 0, per_rank: bool = False):
        super().__init__(section, rank=rank, per_rank=per_rank)
        require("tensorboard", "tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = output_dir(self.section, self.block, rank, per_rank)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def write_events(self, events: Sequence[MonitorEvent]) -> None:
        for name, value, x in events:
            self.writer.add_scalar(name, value, x)
        # DeepSpeed flushes after every batch of events; a crashed run keeps what it logged.
        self.writer.flush()

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
