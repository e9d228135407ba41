"""The top-level config model (``DsConfig``) and its resolved, frozen form (``ResolvedConfig``)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from ds.interfaces.errors import ConfigError
from ds.zero.config.ledger_sections import DsCheckpointConfig, GateSection, LedgerSection
from ds.zero.config.sections import (
    ActivationCheckpointingConfig,
    AioConfig,
    BF16Config,
    CommsLoggerConfig,
    FP16Config,
    MonitorSection,
    OptimizerConfig,
    SchedulerConfig,
    Section,
    WandbConfig,
    ZeroConfig,
)
from ds.zero.config.sections_aux import (
    CometConfig,
    CompileConfig,
    DataTypesConfig,
    FlopsProfilerConfig,
    HybridEngineConfig,
    TensorParallelConfig,
    TimersConfig,
    TorchAutocastConfig,
    WeightQuantizationConfig,
)
from ds.zero.config.types import Int, TopIntOrAuto


class DsConfig(Section):
    """A DeepSpeed-compatible training config (the JSON users already have)."""

    RAW_AUTO: ClassVar[bool] = True  # DeepSpeed reads top-level keys without a model
    # Keys the load ignored as DeepSpeed does (unknown where it reads key by key), for reports.
    _ignored: list[str] = PrivateAttr(default_factory=list)

    train_batch_size: TopIntOrAuto | None = None
    train_micro_batch_size_per_gpu: TopIntOrAuto | None = None
    gradient_accumulation_steps: TopIntOrAuto | None = None
    steps_per_print: Int | None = Field(10, ge=1)
    wall_clock_breakdown: bool = False
    # DeepSpeed 0.19.8 clips at 1.0 when the key is absent (GRADIENT_CLIPPING_DEFAULT), so a
    # migrated config trains the same; 0 disables clipping.
    gradient_clipping: float | Literal["auto"] = Field(1.0)
    prescale_gradients: bool = False
    gradient_predivide_factor: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    communication_data_type: Literal["fp32", "fp16", "bf16"] | None = None
    gradient_allreduce_op: Literal["mean", "sum"] = "mean"
    fp16: FP16Config = Field(default_factory=FP16Config)
    bf16: BF16Config = Field(default_factory=BF16Config, alias="bf16")
    optimizer: OptimizerConfig | None = None
    scheduler: SchedulerConfig | None = None
    zero_optimization: ZeroConfig = Field(default_factory=ZeroConfig)
    zero_allow_untested_optimizer: bool = False
    activation_checkpointing: ActivationCheckpointingConfig = Field(
        default_factory=ActivationCheckpointingConfig
    )
    aio: AioConfig = Field(default_factory=AioConfig)
    comms_logger: CommsLoggerConfig = Field(default_factory=CommsLoggerConfig)
    csv_monitor: MonitorSection = Field(default_factory=MonitorSection)
    checkpoint: DsCheckpointConfig = Field(default_factory=DsCheckpointConfig)
    seed: Int | None = None
    ledger: LedgerSection | None = None  # ds's run ledger and approvals (docs/ledger.md)
    gate: GateSection | None = None  # ds's readiness gate thresholds

    # Documented DeepSpeed sections ds accepts without acting on (see unimplemented.py).
    allgather_size: Int | None = None  # with the old "zero_optimization": true form
    autotuning: dict[str, Any] | None = None
    comet: CometConfig | None = None
    compile: CompileConfig | None = None
    data_efficiency: dict[str, Any] | None = None
    data_types: DataTypesConfig | None = None
    dataloader_drop_last: bool | None = None
    datastates_ckpt: Any = None
    disable_allgather: bool | None = None
    disable_python_gc: Any = None
    dump_state: bool | None = None
    expert_parallel: dict[str, Any] | None = None
    flops_profiler: FlopsProfilerConfig | None = None
    hybrid_engine: HybridEngineConfig | None = None
    log_level: Any = None
    managed_gradient_accumulation: bool | None = None
    memory_breakdown: bool | None = None
    pipeline: dict[str, Any] | None = None
    sequence_parallel_size: Int | None = None
    seq_parallel_communication_data_type: Literal["fp32", "fp16", "bf16"] | None = None
    tensor_parallel: TensorParallelConfig | None = None  # type: ignore[valid-type]
    tensorboard: MonitorSection | None = None
    timers: TimersConfig | None = None
    torch_autocast: TorchAutocastConfig | None = None
    use_data_before_expert_parallelism: bool | None = None
    vocabulary_size: Int | None = None
    wandb: WandbConfig | None = None
    weight_quantization: WeightQuantizationConfig | None = None  # type: ignore[valid-type]
    zero_force_ds_cpu_optimizer: bool | None = None

    @field_validator(
        "communication_data_type",
        "seq_parallel_communication_data_type",
        mode="before",
    )
    @classmethod
    def _lower(cls, value: Any) -> Any:
        # DeepSpeed lower-cases these before comparing ("BF16" is "bf16").
        return value.lower() if isinstance(value, str) else value

    @field_validator("gradient_allreduce_op", mode="before")
    @classmethod
    def _allreduce_op(cls, value: Any) -> Any:
        value = value.lower() if isinstance(value, str) else value  # "SUM" is "sum"
        if value not in ("mean", "sum"):
            raise ValueError(
                f"Invalid gradient_allreduce_op {value!r}: use 'mean' (average the ranks' "
                "gradients, the default) or 'sum' (add them)"
            )
        return value

    @field_validator("steps_per_print", mode="before")
    @classmethod
    def _never_print(cls, value: Any) -> Any:
        # DeepSpeed takes any number; accelerate passes float("inf") for "never print", which
        # ds spells None (no step is a multiple of it).
        return None if isinstance(value, float) and value == math.inf else value

    @model_validator(mode="before")
    @classmethod
    def _bfloat16_alias(cls, data: Any) -> Any:
        # DeepSpeed accepts "bfloat16" as an older spelling of the "bf16" section.
        if isinstance(data, dict) and "bfloat16" in data:
            data = dict(data)
            if "bf16" in data:
                raise ValueError("give either 'bf16' or its older spelling 'bfloat16', not both")
            data["bf16"] = data.pop("bfloat16")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> DsConfig:
        problems: list[str] = []
        if self.fp16.enabled is True and self.bf16.enabled is True:
            problems.append("fp16.enabled and bf16.enabled are both true; enable at most one")
        zero = self.zero_optimization
        problems += self._deepspeed_checks()
        offload = zero.offload_optimizer_device
        if offload != "none":
            if zero.stage == 0:
                problems.append(
                    f"zero_optimization.offload_optimizer.device={offload!r} needs ZeRO stage 1, "
                    "2 or 3; set zero_optimization.stage"
                )
            if offload == "nvme" and zero.stage != 3:
                problems.append(
                    "zero_optimization.offload_optimizer.device='nvme' needs ZeRO stage 3"
                )
            if offload == "nvme" and not zero.offload_optimizer.nvme_path:  # type: ignore[union-attr]
                problems.append(
                    "zero_optimization.offload_optimizer.nvme_path is required for nvme"
                )
            if self.optimizer is not None and self.optimizer.type == "muon":
                # Muon's Newton-Schulz step needs each whole matrix, which the host kernels
                # (one flat partition per rank) do not hold.
                problems.append(
                    "optimizer.type 'muon' with zero_optimization.offload_optimizer: Muon with "
                    "reduce scatter does not support optimizer offload, and ds does not offload "
                    "Muon without it either (its step orthogonalizes whole matrices on the "
                    "accelerator); set offload_optimizer.device to 'none' or use Adam/AdamW"
                )
            elif self.optimizer is not None and self.optimizer.type not in (
                "adam",
                "adamw",
                "adagrad",
                "lion",
            ):
                problems.append(
                    f"zero_optimization.offload_optimizer runs the optimizer on the host with the "
                    f"ds-ops-kernels CPU kernels, which provide Adam, AdamW, Adagrad and Lion, not "
                    f"{self.optimizer.type!r}"
                )
        if self.optimizer is not None and self.optimizer.type == "muon" and zero.stage == 3:
            problems.append(
                "optimizer.type 'muon' runs at ZeRO stages 0, 1 and 2 in ds (its Newton-Schulz "
                "step gathers each whole matrix from the stage's flat partitions); stage 3 is not "
                "available with it: set zero_optimization.stage to 2 or use Adam/AdamW"
            )
        if zero.offload_param_device != "none" and zero.stage != 3:
            # DeepSpeed ignores offload_param below stage 3 (only stage 3 partitions parameters);
            # ds does too, and says so.
            from ds.zero.config.notices import UnimplementedConfigWarning

            warnings.warn(
                f"zero_optimization.offload_param.device={zero.offload_param_device!r} has no "
                f"effect at ZeRO stage {zero.stage}: parameters are only partitioned (and "
                "offloaded) at stage 3",
                UnimplementedConfigWarning,
                stacklevel=2,
            )
            zero.offload_param = None
        clip = self.gradient_clipping
        # "not 0 <= clip" also refuses NaN (JSON readers accept it): a negative max norm would
        # flip every gradient's sign, a NaN one make them all NaN.
        if isinstance(clip, float) and not 0 <= clip < math.inf:
            problems.append(f"gradient_clipping must be finite and >= 0 (0 disables), got {clip}")
        for key in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        ):
            value = getattr(self, key)
            if isinstance(value, int) and value <= 0:
                problems.append(f"{key} must be a positive integer, got {value}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _deepspeed_checks(self) -> list[str]:
        """DeepSpeedConfig's own cross-section checks (_do_error_check), with the fix named."""
        problems: list[str] = []
        stage = self.zero_optimization.stage
        for section, key in (
            ("fp16", "fp16_master_weights_and_grads"),
            ("bf16", "bf16_master_weights_and_grads"),
            ("bf16", "bf16_optimizer_states"),
        ):
            if getattr(getattr(self, section), key) and stage not in (1, 2, 3):
                problems.append(f"{section}.{key} needs ZeRO stage 1, 2 or 3 (stage is {stage})")
        if self.bf16.bf16_optimizer_states and not self.bf16.bf16_master_weights_and_grads:
            problems.append(
                "bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads=true"
            )
        if self.gradient_allreduce_op == "sum":
            if stage == 3:
                problems.append(
                    "gradient_allreduce_op='sum' is not supported with ZeRO stage 3; use 'mean' "
                    "or stage 0-2"
                )
            if self.zero_optimization.zenflow is not None:
                problems.append("gradient_allreduce_op='sum' is not supported with ZenFlow")
            if self.compile is not None and self.compile.deepcompile:
                problems.append("gradient_allreduce_op='sum' is not supported with DeepCompile")
        return problems

    @property
    def precision(self) -> Literal["fp32", "fp16", "bf16"]:
        if self.fp16.enabled is True:
            return "fp16"
        if self.bf16.enabled is True:
            return "bf16"
        return "fp32"

    def model_parallel_sizes(self) -> tuple[int, int]:
        """``(tp, sp)``: ``tensor_parallel.autotp_size`` (or ``tensor_parallel.tp.tp_size``) and
        ``sequence_parallel_size``, 1 when unset. Raises ConfigError for a non-positive size."""
        tp_cfg = self.tensor_parallel
        tp: Any = None
        if tp_cfg is not None:
            nested = tp_cfg.tp if isinstance(tp_cfg.tp, dict) else {}
            tp = tp_cfg.autotp_size or nested.get("tp_size")
        out = []
        for name, value in (
            ("tensor_parallel.autotp_size", tp),
            ("sequence_parallel_size", self.sequence_parallel_size),
        ):
            if value is None:
                value = 1
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{name} must be a positive integer, got {value!r}; use 1 to disable it"
                )
            out.append(value)
        return out[0], out[1]


@dataclass(frozen=True)
class ResolvedConfig:
    """The config after "auto" values and the batch triad are resolved for one world size."""

    raw: DsConfig = field(repr=False)
    world_size: int
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    gradient_clipping: float
    reduce_bucket_size: int
    allgather_bucket_size: int

    @property
    def zero(self) -> ZeroConfig:
        return self.raw.zero_optimization

    @property
    def log_level(self) -> Any:
        return self.raw.log_level

    @property
    def param_dtype(self) -> str | None:
        return self.raw.data_types.param_dtype if self.raw.data_types else None

    @property
    def buffer_dtype(self) -> str | None:
        return self.raw.data_types.buffer_dtype if self.raw.data_types else None

    @property
    def stage(self) -> int:
        return int(self.raw.zero_optimization.stage)

    @property
    def managed_gradient_accumulation(self) -> bool:
        """False: the caller's ``step()`` ends every window (ds.zero.engine_accumulation)."""
        return self.raw.managed_gradient_accumulation is not False

    @property
    def precision(self) -> Literal["fp32", "fp16", "bf16"]:
        return self.raw.precision

    def get(self, key: str, default: Any = None) -> Any:
        """A top-level section as a plain value, the batch keys resolved: DeepSpeed's
        ``engine.config`` is the config dict, and code written against it reads it so
        (transformers' ``save_model``: ``engine.config.get("zero_optimization", {})``)."""
        resolved = {
            "train_batch_size": self.train_batch_size,
            "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "gradient_clipping": self.gradient_clipping,
        }
        if key in resolved:
            return resolved[key]
        return self.raw.model_dump().get(key, default)
