"""Pydantic models of the DeepSpeed-compatible config sections ds honours.

Field names are DeepSpeed's JSON keys; where DeepSpeed accepts several spellings (``stage3_`` prefixed
and bare ZeRO-3 keys, deprecated names) the alternatives are validation aliases. Sections ds does
not implement yet are listed in :mod:`ds.zero.config.unimplemented`.
"""

from __future__ import annotations

import math
import sys
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from ds.zero.config.base import Section, drop_autos
from ds.zero.config.sections_aux import LeafModuleConfig, ZenFlowConfig
from ds.zero.config.types import FloatOrAuto, Int, IntOrAuto


def _alias(*names: str) -> Any:
    return Field(validation_alias=AliasChoices(*names))


def _not_bool(value: Any, info: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{info.field_name} must be a number, not {value!r}")
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
        _not_bool
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


class OffloadOptimizerConfig(Section):
    device: Literal["none", "cpu", "nvme"] = "none"
    nvme_path: str | None = None
    buffer_count: Int = Field(4, ge=0)
    pin_memory: bool = False
    pipeline_read: bool = False
    pipeline_write: bool = False
    fast_init: bool = False
    ratio: float = Field(1.0, ge=0.0, le=1.0)
    super_offload: bool = False
    cpuadam_cores_perc: float = Field(0.8, ge=0.0, le=1.0)


class OffloadParamConfig(Section):
    device: Literal["none", "cpu", "nvme"] = "none"
    nvme_path: str | None = None
    buffer_count: Int = Field(5, ge=0)
    buffer_size: Int = Field(100_000_000, ge=0)
    max_in_cpu: Int = Field(1_000_000_000, ge=0)
    pin_memory: bool = False


# A deprecated key and the key replacing it (DeepSpeed refuses both together) ...
_CLASHES = (
    ("cpu_offload", "offload_optimizer"),
    ("cpu_offload_param", "offload_param"),
    (
        "stage3_gather_fp16_weights_on_model_save",
        "stage3_gather_16bit_weights_on_model_save or gather_16bit_weights_on_model_save",
    ),
)
# ... and the two spellings of one ZeRO-3 key (DeepSpeed refuses the second as unknown).
_SPELLINGS = tuple(
    (f"stage3_{k}", k)
    for k in (
        "prefetch_bucket_size",
        "param_persistence_threshold",
        "model_persistence_threshold",
        "max_live_parameters",
        "max_reuse_distance",
        "gather_16bit_weights_on_model_save",
        "use_all_reduce_for_fetch_params",
        "module_granularity_threshold",
        "allgather_sequential",
    )
)


class ZeroConfig(Section):
    stage: Int = Field(0, ge=0, le=3)
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: IntOrAuto = Field(500_000_000)  # DeepSpeed: > 0
    use_multi_rank_bucket_allreduce: bool = True
    allgather_partitions: bool = True
    allgather_bucket_size: IntOrAuto = Field(500_000_000)  # DeepSpeed: >= 0
    compute_grad_norm: bool = True
    overlap_comm: bool | None = None  # None: True for stage 3, False otherwise (DeepSpeed's rule)
    load_from_fp32_weights: bool = True
    elastic_checkpoint: bool = False
    offload_param: OffloadParamConfig | None = None
    offload_optimizer: OffloadOptimizerConfig | None = None
    zenflow: ZenFlowConfig | None = None
    sub_group_size: Int = Field(1_000_000_000, ge=0)
    cpu_offload: bool | None = Field(None, description="deprecated: offload_optimizer.device=cpu")
    cpu_offload_param: bool | None = Field(None, description="deprecated: offload_param.device")
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
    allgather_sequential: bool = _alias("stage3_allgather_sequential", "allgather_sequential")
    # ds's own debug option (DeepSpeed has none): before every stage-3 collective, all-reduce a
    # fingerprint of the parameters it moves and raise ModuleOrderError when ranks disagree.
    # Off by default: verifying reads the fingerprint back to the host.
    check_module_order: bool = _alias("stage3_check_module_order", "check_module_order")
    ignore_unused_parameters: bool = True
    legacy_stage1: bool = False
    round_robin_gradients: bool = False
    parameter_alignment: bool = False
    zero_hpz_partition_size: Int = Field(1, ge=0)
    zero_quantized_weights: bool = False
    zero_quantized_nontrainable_weights: bool = False
    zero_quantized_gradients: bool = False
    memory_efficient_linear: bool = True
    pipeline_loading_checkpoint: bool = False
    override_module_apply: bool = True
    log_trace_cache_warnings: bool = False
    enable_sanity_checks: bool = False
    save_muon_momentum_buffer_in_memory: bool = False
    leaf_module: LeafModuleConfig = Field(default_factory=LeafModuleConfig)

    @model_validator(mode="before")
    @classmethod
    def _stage3_defaults(cls, data: Any) -> Any:
        # Defaults of the aliased ZeRO-3 keys are filled here so that a default never shadows a
        # value given under the other spelling.
        if not isinstance(data, dict):
            return data
        data = drop_autos(cls, data)
        clashes = [
            f"give either {a!r} or {b!r}, not both"
            for a, b in _CLASHES
            if a in data and any(n in data for n in b.split(" or "))
        ]
        for names in _SPELLINGS:
            given = [n for n in names if n in data]
            if len(given) > 1:
                clashes.append(f"{' and '.join(map(repr, given))} are one key; give one of them")
        if clashes:
            raise ValueError("; ".join(clashes))
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
            ("stage3_allgather_sequential", "allgather_sequential"): False,
            ("stage3_check_module_order", "check_module_order"): False,
        }
        out = dict(data)
        for names, default in defaults.items():
            if not any(n in out for n in names):
                out[names[0]] = default
        return out

    @model_validator(mode="after")
    def _deepspeed_checks(self) -> ZeroConfig:
        # The checks of DeepSpeed's DeepSpeedZeroConfig validators, with their reasons.
        problems = []
        if isinstance(self.reduce_bucket_size, int) and self.reduce_bucket_size <= 0:
            problems.append(f"reduce_bucket_size must be > 0, got {self.reduce_bucket_size}")
        if isinstance(self.allgather_bucket_size, int) and self.allgather_bucket_size < 0:
            problems.append(f"allgather_bucket_size must be >= 0, got {self.allgather_bucket_size}")
        for key in ("prefetch_bucket_size", "param_persistence_threshold"):
            value = getattr(self, key)
            if isinstance(value, int) and value < 0:
                problems.append(f"{key} must be >= 0, got {value}")
        for key in ("model_persistence_threshold", "max_live_parameters", "max_reuse_distance"):
            if getattr(self, key) < 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)}")
        if not self.compute_grad_norm and self.stage not in (1, 2):
            problems.append("compute_grad_norm=false is supported only at ZeRO stage 1 or 2")
        ratio = self.offload_optimizer.ratio if self.offload_optimizer else 1.0
        if ratio < 1.0 and self.stage != 3:
            problems.append(f"offload_optimizer.ratio={ratio} (partial offload) needs ZeRO stage 3")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _deprecated(self) -> ZeroConfig:
        if self.cpu_offload and self.offload_optimizer is None:
            self.offload_optimizer = OffloadOptimizerConfig(
                device="cpu", pin_memory=bool(self.cpu_offload_use_pin_memory)
            )
        if self.cpu_offload_param and self.offload_param is None:
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
            "set_grad_none",
            "fp32_optimizer_states",
        }
    ),
    "adagrad": frozenset(
        {"lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value", "amsgrad"}
    ),
    "lion": frozenset({"lr", "betas", "weight_decay", "set_grad_none", "fp32_optimizer_states"}),
    "sgd": frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov"}),
}
OPTIMIZER_PARAMS["adamw"] = OPTIMIZER_PARAMS["adam"]


class OptimizerConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    type: str
    params: dict[str, Any] = Field(default_factory=dict)
    legacy_fusion: bool = False

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
        if "max_grad_norm" in self.params:
            raise ValueError(
                "optimizer.params.max_grad_norm is not an optimizer parameter (DeepSpeed refuses "
                "it too); clip with the top-level 'gradient_clipping' instead"
            )
        msg = unknown_keys_message(self.params, allowed, f"optimizer {self.type} params")
        if msg:
            raise ValueError(msg)
        if self.type in ("sgd", "adagrad"):
            # torch.optim builds these for DeepSpeed and checks their numbers on construction.
            for key in (
                "lr",
                "momentum",
                "dampening",
                "weight_decay",
                "eps",
                "lr_decay",
                "initial_accumulator_value",
            ):
                value = self.params.get(key, 0.0)
                if value == "auto":
                    continue
                if not isinstance(value, int | float) or not 0 <= value < math.inf:
                    raise ValueError(
                        f"optimizer.params.{key} must be a finite number >= 0, got {value!r}"
                    )
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
        "warmup_max_lr": None,  # DeepSpeed's default: the optimizer's LR
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
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
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
        problems = [
            p for key, value in self.params.items() if (p := _param_problem(key, value)) is not None
        ]
        if problems:
            raise ValueError("; ".join(problems))
        if self.params.get("warmup_type", "log") not in ("log", "linear", "auto"):
            import warnings

            from ds.zero.config.notices import UnimplementedConfigWarning

            # DeepSpeed warns and warms up logarithmically; ds does the same.
            warnings.warn(
                f"scheduler.params.warmup_type={self.params['warmup_type']!r} is neither 'log' "
                "nor 'linear'; the warm-up is logarithmic (DeepSpeed's fallback)",
                UnimplementedConfigWarning,
                stacklevel=2,
            )
            self.params["warmup_type"] = "log"
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


# Scheduler params DeepSpeed's schedule classes check when they are built: positive integers,
# and numbers the constructor computes with.
_POSITIVE_INT = frozenset({"warmup_num_steps", "lr_range_test_step_size"})
_POSITIVE = frozenset({"cycle_first_step_size"})
_NON_NEGATIVE = frozenset({"cycle_second_step_size"})


def _param_problem(key: str, value: Any) -> str | None:
    where = f"scheduler.params.{key}"
    if value == "auto" or key == "warmup_type":
        return None
    if key in _POSITIVE_INT:
        if not isinstance(value, int) or value <= 0:
            return f"{where} must be a positive integer, got {value!r}"
        return None
    if value is None and key in (
        "cycle_second_step_size",
        "cycle_second_stair_count",
        "warmup_max_lr",
    ):
        return None  # None: the same as the first half; for WarmupLR, the optimizer's LR
    if isinstance(value, list):
        return (
            f"{where}={value!r}: per-parameter-group lists are not supported by ds's schedules; "
            "give one number"
        )
    if isinstance(value, str) or not isinstance(value, int | float):
        return f"{where} must be a number, got {type(value).__name__} {value!r}"
    if key in _POSITIVE and value <= 0:
        return f"{where} must be positive, got {value!r}"
    if key in _NON_NEGATIVE and value < 0:
        return f"{where} must be >= 0, got {value!r}"
    return None


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
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OptimizerConfig",
    "SchedulerConfig",
    "WandbConfig",
    "ZeroConfig",
]
