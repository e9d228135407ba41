"""``deepspeed.runtime.zero.config``: ``DeepSpeedZeroConfig`` is ds's ``zero_optimization`` model
(DeepSpeed's field names, ``stage3_*`` aliases and defaults) read as DeepSpeed presents it:
``overlap_comm`` resolved for the stage (on at stage 3) and the old ``cpu_offload`` /
``cpu_offload_param`` flags as ``offload_optimizer`` / ``offload_param`` sections."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from pydantic import model_validator

from ds.zero.config.sections import OffloadOptimizerConfig, OffloadParamConfig, ZeroConfig

DeepSpeedZeroOffloadParamConfig = OffloadParamConfig


class DeepSpeedZeroOffloadOptimizerConfig(OffloadOptimizerConfig):
    @property
    def pipeline(self) -> bool:
        """Whether NVMe offload overlaps reads or writes with the step (DeepSpeed's flag)."""
        return bool(self.pipeline_read or self.pipeline_write)


class DeepSpeedZeroConfig(ZeroConfig):
    @model_validator(mode="after")
    def _as_deepspeed_presents_it(self) -> DeepSpeedZeroConfig:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if self.overlap_comm is None:
            put("overlap_comm", int(self.stage) == 3)
        pin = bool(self.cpu_offload_use_pin_memory)
        if self.cpu_offload and self.offload_optimizer is None:
            put("offload_optimizer", OffloadOptimizerConfig(device="cpu", pin_memory=pin))
        if self.offload_optimizer is not None:
            fields = self.offload_optimizer.model_dump(exclude_unset=True)
            put("offload_optimizer", DeepSpeedZeroOffloadOptimizerConfig(**fields))
        if self.cpu_offload_param and self.offload_param is None:
            put("offload_param", OffloadParamConfig(device="cpu", pin_memory=pin))
        if int(self.stage) == 3 and self.elastic_checkpoint:
            from ds.full.compat.deepspeed.utils import logger

            # the flag changes nothing at stage 3; universal checkpoints are what reshard
            logger.warning(
                "zero_optimization.elastic_checkpoint: ZeRO-3 elastic checkpointing is deprecated "
                "and has no effect; convert the checkpoint to a universal checkpoint "
                "(deepspeed.checkpoint.ds_to_universal) to resume at another world size"
            )
        return self


class ZeroStageEnum(IntEnum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


def get_zero_config(param_dict: dict[str, Any]) -> DeepSpeedZeroConfig:
    section = param_dict.get("zero_optimization", {})
    if isinstance(section, bool):  # the old "zero_optimization": true form
        section = {"stage": 1 if section else 0}
    return DeepSpeedZeroConfig(**section)


__all__ = [
    "DeepSpeedZeroConfig",
    "DeepSpeedZeroOffloadOptimizerConfig",
    "DeepSpeedZeroOffloadParamConfig",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "ZeroStageEnum",
    "get_zero_config",
]
