"""The ``comet`` block: ``comet_ml.start(...)`` with the block's settings on the writing rank;
each event logged at most once per ``samples_log_interval`` samples, as DeepSpeed does.
``online: false`` keeps an offline experiment archive on disk."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ds.monitor.base import Monitor, MonitorEvent, require


class CometMonitor(Monitor):
    block = "comet"

    def __init__(self, section: Mapping[str, Any], *, rank: int = 0, per_rank: bool = False):
        super().__init__(section, rank=rank, per_rank=per_rank)
        comet_ml = require("comet_ml", "comet", "comet")
        s = self.section
        self.interval = int(s.get("samples_log_interval", 100))
        self.experiment = comet_ml.start(
            api_key=s.get("api_key"),
            project=s.get("project"),
            workspace=s.get("workspace"),
            experiment_key=s.get("experiment_key"),
            mode=s.get("mode"),
            online=s.get("online"),
        )
        if s.get("experiment_name") is not None:
            self.experiment.set_name(s["experiment_name"])
        self._last: dict[str, int] = {}

    def _due(self, name: str, x: int) -> bool:
        last = self._last.get(name)
        if last is None or x - last >= self.interval:
            self._last[name] = x
            return True
        return False

    def write_events(self, events: Sequence[MonitorEvent]) -> None:
        for name, value, x in events:
            if self._due(name, x):
                self.experiment.log_metric(name, value, step=x)

    def close(self) -> None:
        self.experiment.end()
