"""The ``wandb`` block: ``wandb.init(project, group, entity=team)`` on the writing rank, then one
``log({name: value}, step=x)`` per event, as DeepSpeed does. ``WANDB_MODE=offline`` writes the
run under ``./wandb`` (or ``WANDB_DIR``) without a network."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ds.monitor.base import Monitor, MonitorEvent, require


class WandbMonitor(Monitor):
    block = "wandb"

    def __init__(self, section: Mapping[str, Any], *, rank: int = 0, per_rank: bool = False):
        super().__init__(section, rank=rank, per_rank=per_rank)
        self.wandb = require("wandb", "wandb", "wandb")
        group = self.section.get("group")
        self.run = self.wandb.init(
            project=self.section.get("project") or "deepspeed",
            group=group,
            entity=self.section.get("team"),
            name=f"rank{rank}" if per_rank else None,
            reinit="create_new",
        )

    def write_events(self, events: Sequence[MonitorEvent]) -> None:
        # One log call per step: wandb requires a step's keys together for a non-decreasing step.
        by_step: dict[int, dict[str, float]] = {}
        for name, value, x in events:
            by_step.setdefault(x, {})[name] = value
        for x, data in sorted(by_step.items()):
            self.run.log(data, step=x)

    def close(self) -> None:
        self.run.finish()
