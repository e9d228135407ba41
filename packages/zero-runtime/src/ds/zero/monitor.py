"""The ``csv_monitor`` config section: step metrics appended to CSV files, one per metric, as
DeepSpeed's CSV monitor lays them out (``<output_path>/<job_name>/Train_Samples_<metric>.csv``)."""

from __future__ import annotations

import csv
from pathlib import Path

from ds.interfaces.telemetry import EventBus, StepMetrics

_METRICS = {
    "train_loss": "loss",
    "lr": "lr",
    "step_time_s": "step_time_s",
    "loss_scale": "loss_scale",
}


class CsvMonitor:
    """Subscribes to an engine's EventBus; rank 0 writes ``samples,value`` rows."""

    def __init__(self, output_path: str, job_name: str) -> None:
        self.directory = Path(output_path or ".") / job_name
        self.directory.mkdir(parents=True, exist_ok=True)
        self._samples = 0

    def attach(self, bus: EventBus) -> None:
        bus.subscribe(self.write, StepMetrics)

    def write(self, m: StepMetrics) -> None:
        if m.rank != 0:
            return
        self._samples += m.samples
        for name, attr in _METRICS.items():
            value = getattr(m, attr)
            if value is None:
                continue
            path = self.directory / f"Train_Samples_{name}.csv"
            new = not path.exists()
            with path.open("a", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(["samples", name])
                writer.writerow([self._samples, value])
