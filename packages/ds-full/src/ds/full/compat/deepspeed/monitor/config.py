"""``deepspeed.monitor.config``: the monitor sections of a DeepSpeed config, as ds's config models
(one schema): ``TensorBoardConfig``/``CSVConfig`` are ds's ``MonitorSection``, ``WandbConfig`` and
``CometConfig`` ds's sections of the same names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ds.zero.config.sections import MonitorSection, WandbConfig
from ds.zero.config.sections_aux import CometConfig

TensorBoardConfig = MonitorSection
CSVConfig = MonitorSection


class DeepSpeedMonitorConfig(BaseModel):
    """The four monitor sections; ``enabled`` when any of them is."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    tensorboard: MonitorSection = Field(default_factory=MonitorSection)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    csv_monitor: MonitorSection = Field(default_factory=MonitorSection)
    comet: CometConfig = Field(default_factory=CometConfig)

    @property
    def enabled(self) -> bool:
        return any(s.enabled for s in (self.tensorboard, self.wandb, self.csv_monitor, self.comet))


def get_monitor_config(param_dict: Mapping[str, Any]) -> DeepSpeedMonitorConfig:
    """The monitor sections of a config dict (absent or ``{}`` sections take the defaults)."""
    keys = ("tensorboard", "wandb", "csv_monitor", "comet")
    return DeepSpeedMonitorConfig(**{k: param_dict[k] or {} for k in keys if k in param_dict})


__all__ = [
    "CSVConfig",
    "CometConfig",
    "DeepSpeedMonitorConfig",
    "TensorBoardConfig",
    "WandbConfig",
    "get_monitor_config",
]
