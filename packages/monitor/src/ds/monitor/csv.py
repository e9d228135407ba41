"""The ``csv_monitor`` block: one ``<event name with / as _>.csv`` per event in
``<output_path>/<job_name>``, header ``step,<last name part>``, as DeepSpeed's CSV monitor writes."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from typing import Any

from ds.monitor.base import Monitor, MonitorEvent, output_dir


class CsvMonitor(Monitor):
    block = "csv_monitor"

    def __init__(self, section: Mapping[str, Any], *, rank: int = 0, per_rank: bool = False):
        super().__init__(section, rank=rank, per_rank=per_rank)
        self.log_dir = output_dir(self.section, self.block, rank, per_rank)
        self._started: set[str] = set()

    def write_events(self, events: Sequence[MonitorEvent]) -> None:
        for name, value, x in events:
            filename = name.replace("/", "_").replace(" ", "_")
            path = self.log_dir / f"{filename}.csv"
            with path.open("a", newline="") as f:
                writer = csv.writer(f)
                if filename not in self._started:
                    self._started.add(filename)
                    if f.tell() == 0:
                        writer.writerow(["step", name.rsplit("/", 1)[-1]])
                writer.writerow([x, value])
