"""Pydantic models of the DeepSpeed-compatible config sections ds honours.

Field names are DeepSpeed's JSON keys; where DeepSpeed accepts several spellings (``stage3_`` prefixed
and bare ZeRO-3 keys, deprecated names) the alternatives are validation aliases. Sections ds does
not implement yet are listed in :mod:`ds.zero.config.unimplemented`.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field, field_validator, model_validator

from ds.zero.config.types import STRICT, FloatOrAuto, Int, IntOrAuto


def _alias(*names: str) -> Any:
    return Field(validation_alias=AliasChoices(*names))


class Section(BaseModel):
    model_config = STRICT


class FP16Config(Section):
    enabled: bool | Literal["auto"] = False
    auto_cast: bool = False
    loss_scale: float = Field(
        0.0, ge=0.0, allow_inf_nan=False, description="0 selects dynamic loss scaling"
    )
    initial_scale_power: Int = Field(16, ge=0, le=64)
    loss_scale_window: Int = Field(1000, ge=1)
    hysteresis: Int = Field(2, ge=1)
    consecutive_hysteresis: bool = False
    min_loss_scale: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    fp16_master_weights_and_grads: bool = False


class BF16Config(Section):
    enabled: bool | Literal["auto"] = False
    immediate_grad_update: bool = False
    check_grad_overflow: bool = False


class OffloadOptimizerConfig(Section):
    device: Literal["none", "cpu", "nvme"] = "none"
    nvme_path: str | None = None
    buffer_count: Int = Field(4, ge=1)
    pin_memory: bool = False
    pipeline_read: bool = False
    pipeline_write: bool = False
    fast_init: bool = False
    ratio: float = Field(1.0, ge=0.0, le=1.0)


class OffloadParamConfig(Section):
    device: Literal["none", "cpu", "nvme"] = "none"
    nvme_path: str | None = None
    buffer_count: Int = Field(5, ge=1)
    buffer_size: Int = Field(100_000_000, ge=1)
    max_in_cpu: Int = Field(1_000_000_000, ge=0)
    pin_memory: bool = False


class ZeroConfig(Section):
    stage: Int = Field(0, ge=0, le=3)
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: IntOrAuto = Field(500_000_000)
    use_multi_rank_bucket_allreduce: bool = True
    allgather_partitions: bool = True
    allgather_bucket_size: IntOrAuto = Field(500_000_000)
    overlap_comm: bool | None = None  # None: True for stage 3, False otherwise (DeepSpeed's rule)
    load_from_fp32_weights: bool = True
    elastic_checkpoint: bool = False
    offload_param: OffloadParamConfig | None = None
    offload_optimizer: OffloadOptimizerConfig | None = None
    sub_group_size: Int = Field(1_000_000_000, ge=1)
    cpu_offload: bool | None = Field(None, description="deprecated: offload_optimizer.device=cpu")
    cpu_offload_params: bool | None = Field(None, description="deprecated: offload_param.device")
    cpu_offload_use_pin_memory: bool | None = None
    prefetch_bucket_size: IntOrAuto = _alias("stage3_prefetch_bucket_size", "prefetch_bucket_size")
    param_persistence_threshold: IntOrAuto = _alias(
        "stage3_param_persistence_threshold", "param_persistence_threshold"
    )
    model_persistence_threshold: Int = _alias(
        "stage3_model_persistence_threshold", "model_persistence_threshold"
    )
    max_live_parameters: Int = _alias("stage3_max_live_parameters", "max_live_parameters")
    max_reuse_distance: Int = _alias("stage3_max_reuse_distance", "max_reuse_distance")
    gather_16bit_weights_on_model_save: bool = _alias(
        "stage3_gather_16bit_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
    )
    use_all_reduce_for_fetch_params: bool = _alias(
        "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"
    )
    module_granularity_threshold: Int = _alias(
        "stage3_module_granularity_threshold", "module_granularity_threshold"
    )
    # ds's own debug option (DeepSpeed has none): before every stage-3 collective, all-reduce a
    # fingerprint of the parameters it moves and raise ModuleOrderError when ranks disagree.
    # Off by default: verifying reads the fingerprint back to the host.
    check_module_order: bool = _alias("stage3_check_module_order", "check_module_order")
    ignore_unused_parameters: bool = True
    legacy_stage1: bool = False
    round_robin_gradients: bool = False
    zero_hpz_partition_size: Int = Field(1, ge=1)
    zero_quantized_weights: bool = False
    zero_quantized_nontrainable_weights: bool = False
    zero_quantized_gradients: bool = False
    zeropp_loco_param: dict[str, Any] | None = None
    mics_shard_size: Int = -1
    mics_hierarchical_params_gather: bool = False
    memory_efficient_linear: bool = True
    pipeline_loading_checkpoint: bool = False
    override_module_apply: bool = True
    log_trace_cache_warnings: bool = False

    @model_validator(mode="before")
    @classmethod
    def _stage3_defaults(cls, data: Any) -> Any:
        # Defaults of the aliased ZeRO-3 keys are filled here so that a default never shadows a
        # value given under the other spelling.
        if not isinstance(data, dict):
            return data
        defaults: dict[tuple[str, ...], Any] = {
            ("stage3_prefetch_bucket_size", "prefetch_bucket_size"): 50_000_000,
            ("stage3_param_persistence_threshold", "param_persistence_threshold"): 100_000,
            ("stage3_model_persistence_threshold", "model_persistence_threshold"): sys.maxsize,
            ("stage3_max_live_parameters", "max_live_parameters"): 1_000_000_000,
            ("stage3_max_reuse_distance", "max_reuse_distance"): 1_000_000_000,
            (
                "stage3_gather_16bit_weights_on_model_save",
                "gather_16bit_weights_on_model_save",
                "stage3_gather_fp16_weights_on_model_save",
            ): False,
            ("stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"): False,
            ("stage3_module_granularity_threshold", "module_granularity_threshold"): 0,
            ("stage3_check_module_order", "check_module_order"): False,
        }
        out = dict(data)
        for names, default in defaults.items():
            if not any(n in out for n in names):
                out[names[0]] = default
        return out

    @model_validator(mode="after")
    def _deprecated(self) -> ZeroConfig:
        if self.cpu_offload and self.offload_optimizer is None:
            self.offload_optimizer = OffloadOptimizerConfig(
                device="cpu", pin_memory=bool(self.cpu_offload_use_pin_memory)
            )
        if self.cpu_offload_params and self.offload_param is None:
            self.offload_param = OffloadParamConfig(
                device="cpu", pin_memory=bool(self.cpu_offload_use_pin_memory)
            )
        return self

    @property
    def overlap(self) -> bool:
        return self.overlap_comm if self.overlap_comm is not None else self.stage == 3

    @property
    def offload_optimizer_device(self) -> str:
        return self.offload_optimizer.device if self.offload_optimizer else "none"

    @property
    def offload_param_device(self) -> str:
        return self.offload_param.device if self.offload_param else "none"


OPTIMIZERS_IMPLEMENTED = ("adam", "adamw", "adagrad", "lion", "sgd")
# Documented by DeepSpeed; not provided by ds (a config naming one is rejected, never substituted).
OPTIMIZERS_DOCUMENTED = (
    "lamb",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
    "muadam",
    "muadamw",
    "musgd",
)

OPTIMIZER_PARAMS: dict[str, frozenset[str]] = {
    "adam": frozenset(
        {
            "lr",
            "betas",
            "eps",
            "weight_decay",
            "amsgrad",
            "bias_correction",
            "adam_w_mode",
            "torch_adam",
            "fused",
            "foreach",
        }
    ),
    "adagrad": frozenset({"lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value"}),
    "lion": frozenset({"lr", "betas", "weight_decay"}),
    "sgd": frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov"}),
}
OPTIMIZER_PARAMS["adamw"] = OPTIMIZER_PARAMS["adam"]


class OptimizerConfig(Section):
    type: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        key = value.lower()
        if key in OPTIMIZERS_IMPLEMENTED:
            return key
        if key in OPTIMIZERS_DOCUMENTED:
            raise ValueError(
                f"optimizer {value!r} is a DeepSpeed optimizer ds does not provide; use one of "
                f"Adam, AdamW, Adagrad, Lion, SGD or pass your own torch optimizer to initialize()"
            )
        raise ValueError(
            f"unknown optimizer type {value!r}; use one of Adam, AdamW, Adagrad, Lion, SGD"
        )

    @model_validator(mode="after")
    def _known_params(self) -> OptimizerConfig:
        from ds.zero.config.suggest import unknown_keys_message

        allowed = OPTIMIZER_PARAMS[self.type]
        msg = unknown_keys_message(self.params, allowed, f"optimizer {self.type} params")
        if msg:
            raise ValueError(msg)
        lr = self.params.get("lr", 1e-3)
        if lr != "auto" and (
            not isinstance(lr, int | float) or isinstance(lr, bool) or not 0 <= lr < math.inf
        ):  # "not 0 <= lr" also refuses NaN, which JSON readers accept as a number
            raise ValueError(
                f"optimizer.params.lr must be a finite, non-negative number, got {lr!r}"
            )
        betas = self.params.get("betas")
        if betas is not None and betas != "auto":
            ok = isinstance(betas, list | tuple) and len(betas) == 2
            if not ok or not all(isinstance(b, int | float) and 0.0 <= b < 1.0 for b in betas):
                raise ValueError(
                    f"optimizer.params.betas must be two numbers in [0, 1), got {betas!r}"
                )
        return self


SCHEDULER_PARAMS: dict[str, dict[str, Any]] = {
    "WarmupLR": {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": 0.001,
        "warmup_num_steps": 1000,
        "warmup_type": "log",
        "last_batch_iteration": -1,
    },
    "WarmupDecayLR": {
        "total_num_steps": None,
        "warmup_min_lr": 0.0,
        "warmup_max_lr": 0.001,
        "warmup_num_steps": 1000,
        "warmup_type": "log",
        "last_batch_iteration": -1,
    },
    "WarmupCosineLR": {
        "total_num_steps": None,
        "warmup_min_ratio": 0.0,
        "warmup_num_steps": 1000,
        "cos_min_ratio": 0.0001,
        "warmup_type": "log",
        "last_batch_iteration": -1,
    },
    "OneCycle": {
        "cycle_min_lr": None,
        "cycle_max_lr": None,
        "decay_lr_rate": 0.0,
        "cycle_first_step_size": 2000,
        "cycle_second_step_size": None,
        "cycle_first_stair_count": 0,
        "cycle_second_stair_count": None,
        "decay_step_size": 0,
        "cycle_momentum": True,
        "cycle_min_mom": 0.8,
        "cycle_max_mom": 0.9,
        "decay_mom_rate": 0.0,
        "last_batch_iteration": -1,
    },
    "LRRangeTest": {
        "lr_range_test_min_lr": 0.001,
        "lr_range_test_step_size": 2000,
        "lr_range_test_step_rate": 1.0,
        "lr_range_test_staircase": False,
        "last_batch_iteration": -1,
    },
}


class SchedulerConfig(Section):
    type: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        from ds.zero.config.suggest import closest

        if value in SCHEDULER_PARAMS:
            return value
        hint = closest(value, SCHEDULER_PARAMS)
        raise ValueError(
            f"unknown scheduler type {value!r}{hint}; use one of {', '.join(SCHEDULER_PARAMS)}"
        )

    @model_validator(mode="after")
    def _known_params(self) -> SchedulerConfig:
        from ds.zero.config.suggest import unknown_keys_message

        defaults = SCHEDULER_PARAMS[self.type]
        msg = unknown_keys_message(self.params, defaults, f"scheduler {self.type} params")
        if msg:
            raise ValueError(msg)
        for key, value in self.params.items():
            if key == "warmup_type":
                if value not in ("log", "linear"):
                    raise ValueError(f"warmup_type must be 'log' or 'linear', got {value!r}")
            elif isinstance(value, bool) or value is None or value == "auto":
                continue
            elif not isinstance(value, int | float):
                raise ValueError(
                    f"scheduler.params.{key} must be a number, got {type(value).__name__} {value!r}"
                )
        merged = {**defaults, **self.params}
        needs = [
            k
            for k, v in merged.items()
            if v is None and k in ("total_num_steps", "cycle_min_lr", "cycle_max_lr")
        ]
        if needs:
            raise ValueError(f"scheduler {self.type} needs params {', '.join(needs)}")
        return self

    def resolved_params(self) -> dict[str, Any]:
        return {**SCHEDULER_PARAMS[self.type], **self.params}


class ActivationCheckpointingConfig(Section):
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    contiguous_memory_optimization: bool = False
    number_checkpoints: Int | None = None
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False


class AioConfig(Section):
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


class CheckpointConfig(Section):
    tag_validation: Literal["Ignore", "Warn", "Fail", "ignore", "warn", "fail"] = "Warn"
    load_universal: bool = False
    use_node_local_storage: bool = False
    parallel_write: dict[str, Any] = Field(default_factory=dict)
    async_save: bool = False


__all__ = [
    "ActivationCheckpointingConfig",
    "AioConfig",
    "BF16Config",
    "CheckpointConfig",
    "CommsLoggerConfig",
    "FP16Config",
    "FloatOrAuto",
    "MonitorSection",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OptimizerConfig",
    "SchedulerConfig",
    "WandbConfig",
    "ZeroConfig",
]
