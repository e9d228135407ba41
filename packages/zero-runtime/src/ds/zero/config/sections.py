"""Pydantic models of the DeepSpeed-compatible config sections ds honours.

Field names are DeepSpeed's JSON keys; where DeepSpeed accepts several spellings (``stage3_`` prefixed
and bare ZeRO-3 keys, deprecated names) the alternatives are validation aliases. Sections ds does
not implement yet are listed in :mod:`ds.zero.config.unimplemented`.

The ``zero_optimization`` section lives in :mod:`ds.zero.config.sections_zero`, ``optimizer`` and
``scheduler`` in :mod:`ds.zero.config.sections_optim`; both are re-exported here.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from ds.zero.config.base import Section
from ds.zero.config.sections_optim import (
    OPTIMIZER_PARAMS,
    OPTIMIZERS_DOCUMENTED,
    OPTIMIZERS_IMPLEMENTED,
    SCHEDULER_PARAMS,
    OptimizerConfig,
    SchedulerConfig,
)
from ds.zero.config.sections_zero import (
    OffloadOptimizerConfig,
    OffloadParamConfig,
    ZeroConfig,
    _alias,
)
from ds.zero.config.types import FloatOrAuto, Int


def _plain_number(value: Any, info: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{info.field_name} must be a number, not {value!r}")
    if not isinstance(value, (int, float, str)):  # a numeric string is read as its number
        raise ValueError(f"{info.field_name} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{info.field_name} must be finite, got {value!r}")
    return value


class FP16Config(Section):
    enabled: bool | Literal["auto"] = False
    auto_cast: bool = False
    loss_scale: float = Field(
        0.0, ge=0.0, allow_inf_nan=False, description="0 selects dynamic loss scaling"
    )
    initial_scale_power: Int = Field(16, ge=0, le=64)
    loss_scale_window: Int = 1000
    hysteresis: Int = Field(2, ge=1)
    consecutive_hysteresis: bool = False
    min_loss_scale: Int = 1
    fp16_master_weights_and_grads: bool = False

    _numbers = field_validator("loss_scale", "loss_scale_window", "min_loss_scale", mode="before")(
        _plain_number
    )

    @model_validator(mode="after")
    def _dynamic_scaling(self) -> FP16Config:
        # As DeepSpeed: the window and the floor only matter (and are checked) when dynamic
        # loss scaling is on, i.e. fp16 enabled with loss_scale 0.
        if self.enabled is True and self.loss_scale == 0:
            if self.loss_scale_window <= 0:
                raise ValueError(
                    f"loss_scale_window must be > 0 with dynamic loss scaling (loss_scale=0), "
                    f"got {self.loss_scale_window}"
                )
            if self.min_loss_scale <= 0:
                raise ValueError(
                    f"min_loss_scale must be > 0 with dynamic loss scaling (loss_scale=0), "
                    f"got {self.min_loss_scale}"
                )
        return self


class BF16Config(Section):
    enabled: bool | Literal["auto"] = False
    immediate_grad_update: bool = False
    check_grad_overflow: bool = False
    bf16_master_weights_and_grads: bool = False
    bf16_optimizer_states: bool = False


class ActivationCheckpointingConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    contiguous_memory_optimization: bool = False
    number_checkpoints: Int | None = None
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False


class AioConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    block_size: Int = Field(1_048_576, ge=1)
    queue_depth: Int = Field(8, ge=1)
    intra_op_parallelism: Int = _alias("intra_op_parallelism", "thread_count")
    single_submit: bool = False
    overlap_events: bool = True
    use_gds: bool = False

    @model_validator(mode="before")
    @classmethod
    def _default_threads(cls, data: Any) -> Any:
        if isinstance(data, dict) and not ({"intra_op_parallelism", "thread_count"} & set(data)):
            return {**data, "intra_op_parallelism": 1}
        return data


class CommsLoggerConfig(Section):
    enabled: bool = False
    verbose: bool = False
    prof_all: bool = True
    debug: bool = False
    prof_ops: list[str] = Field(default_factory=list)


class MonitorSection(Section):
    enabled: bool = False
    output_path: str = ""
    job_name: str = "DeepSpeedJobName"


class WandbConfig(Section):
    enabled: bool = False
    group: str | None = None
    team: str | None = None
    project: str = "deepspeed"


class ParallelWriteConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    pipeline_stage: bool = False

    @field_validator("pipeline_stage", mode="before")
    @classmethod
    def _exactly_bool(cls, value: Any) -> Any:
        if value not in (True, False) or not isinstance(value, bool | int):
            raise ValueError(f"pipeline_stage must be true or false, got {value!r}")
        return value


class CheckpointWriterConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    type: str = "FAST"
    io_buffer_size: Int = 64 * 1024**2
    io_buffer_double: bool = True
    show_statistics: bool = False
    data_parallel: str | None = None
    decoupled: bool = False
    io_multiplier: Int = 1

    @field_validator("type", "data_parallel", mode="before")
    @classmethod
    def _upper(cls, value: Any, info: Any) -> Any:
        choices = {
            "type": ("MOCK", "PYTHON", "FAST"),
            "data_parallel": ("REPLICA", "SOCKET", "MACHINE"),
        }
        if value is None and info.field_name == "data_parallel":
            return None
        if not isinstance(value, str) or value.upper() not in choices[info.field_name]:
            raise ValueError(f"must be one of {', '.join(choices[info.field_name])}, got {value!r}")
        return value.upper()


class CheckpointConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    tag_validation: str = "Warn"
    load_universal: bool = False
    use_node_local_storage: bool = False
    parallel_write: ParallelWriteConfig = Field(default_factory=ParallelWriteConfig)
    checkpoint_serialization: bool = True
    writer: CheckpointWriterConfig | None = None
    async_save: bool = False

    @field_validator("tag_validation", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        # DeepSpeed compares upper-cased: "warn", "Warn" and "WARN" are one mode.
        if not isinstance(value, str) or value.upper() not in ("WARN", "IGNORE", "FAIL"):
            raise ValueError(f"tag_validation must be Warn, Ignore or Fail, got {value!r}")
        return value.capitalize()


__all__ = [
    "ActivationCheckpointingConfig",
    "AioConfig",
    "BF16Config",
    "CheckpointConfig",
    "CommsLoggerConfig",
    "FP16Config",
    "FloatOrAuto",
    "MonitorSection",
    "OPTIMIZERS_DOCUMENTED",
    "OPTIMIZERS_IMPLEMENTED",
    "OPTIMIZER_PARAMS",
    "SCHEDULER_PARAMS",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OptimizerConfig",
    "SchedulerConfig",
    "WandbConfig",
    "ZeroConfig",
]
