"""Config sections DeepSpeed validates with strict models but ds does not act on (yet).

They are modelled so that ds refuses exactly what DeepSpeed 0.19.8 refuses: an unknown key or a
value its model would not take. Field names, types and ranges follow DeepSpeed's pydantic models
(``HybridEngineConfig``, ``CompileConfig``, ``DeepSpeedThroughputTimerConfig``, ``CometConfig``,
``ZenFlowConfig``, ``DeepSpeedZeroLeafModuleConfig``); where DeepSpeed's own field types are rich
(torch dtypes, nested models) and ds only needs the key set, a field is typed ``Any``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator

from ds.zero.config.base import Section
from ds.zero.config.types import Int


class HybridEngineConfig(Section):
    enabled: bool = False
    max_out_tokens: Int = Field(512, gt=0)
    inference_tp_size: Int = 1
    release_inference_cache: bool = False
    pin_parameters: bool = True
    tp_gather_partition_size: Int = 8
    enable_cuda_graph: bool = False


class CompileConfig(Section):
    deepcompile: bool = False
    autoep_non_moe: bool = False
    free_activation: bool = False
    free_activation_threshold: Int = 10 * 1024 * 1024
    offload_activation: bool = False
    offload_activation_pin_memory: bool = True
    offload_opt_states: bool = False
    double_buffer: bool = True
    symmetric_memory: bool = False
    debug_log: bool = False
    offload_parameters: bool = False
    sync_before_reduce: bool = False
    sync_after_reduce: bool = False
    sync_before_allgather: bool = False
    sync_after_allgather: bool = False
    keep_int_input_tensors: bool = True
    keep_all_input_tensors: bool = False
    passes: list[Literal["z1", "z3", "autosp", "autotp"]] | None = None


class ThroughputTimerConfig(Section):
    enabled: bool = True
    synchronized: bool = True


class TimersConfig(Section):
    # DeepSpeed reads only "throughput" here and ignores any other key (ds warns about them).
    throughput: ThroughputTimerConfig = Field(default_factory=ThroughputTimerConfig)


class CometConfig(Section):
    enabled: bool = False
    samples_log_interval: Int = 100
    project: str | None = None
    workspace: str | None = None
    api_key: str | None = None
    experiment_name: str | None = None
    experiment_key: str | None = None
    online: bool | None = None
    mode: str | None = None


class ZenFlowConfig(Section):
    topk_ratio: float = Field(0.1, gt=0.0, lt=1.0)
    select_strategy: str = "auto"
    select_interval: str | Int = "auto"
    update_interval: str | Int = "auto"
    overlap_step: bool = False
    offload: bool = False
    auto_ratio: float = Field(0.99, ge=0.0, le=1.0)
    full_warm_up_rounds: Int = 0
    pt_reserved_cores_perc: float = Field(0.5, ge=0.0, le=1.0)
    steps_per_epoch: Int | None = None

    # "auto" is a real value of these fields, not a placeholder for a framework to fill.
    AUTO_IS_VALUE: ClassVar[frozenset[str]] = frozenset(
        {"select_strategy", "select_interval", "update_interval"}
    )

    @model_validator(mode="after")
    def _choices(self) -> ZenFlowConfig:
        if self.select_strategy not in ("auto", "step", "epoch"):
            raise ValueError(
                f"select_strategy must be 'auto', 'step' or 'epoch', got {self.select_strategy!r}"
            )
        for key in ("select_interval", "update_interval"):
            value = getattr(self, key)
            if isinstance(value, str) and value != "auto":
                raise ValueError(f"{key} must be 'auto' or an integer, got {value!r}")
        if isinstance(self.update_interval, int) and self.update_interval < 1:
            raise ValueError(f"update_interval must be at least 1, got {self.update_interval}")
        return self


# transformers' sparse MoE blocks, ZeRO-3 leaves by default (as in DeepSpeed 0.19.8): each routes
# tokens to a data-dependent subset of its experts (see ds.zero.stage3.leaf).
DEFAULT_LEAF_MODULE_CLASSES: list[str] = [
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
]


class LeafModuleConfig(Section):
    """``zero_optimization.leaf_module``: the modules stage 3 gathers as one unit."""

    classes: list[str] = Field(default_factory=lambda: list(DEFAULT_LEAF_MODULE_CLASSES))
    names: list[str] = Field(default_factory=list)
    name_suffixes: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _one_string_is_a_list(cls, data: Any) -> Any:
        if data is None:
            return {}
        if isinstance(data, dict):
            return {k: [v] if isinstance(v, str) else v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _dedupe(self) -> LeafModuleConfig:
        for key in ("classes", "names", "name_suffixes"):
            object.__setattr__(self, key, list(dict.fromkeys(map(str, getattr(self, key)))))
        return self


def _keys_only(name: str, keys: tuple[str, ...]) -> type[Section]:
    # Sections whose key set ds checks as DeepSpeed does, values passed through unread.
    fields: dict[str, Any] = {k: (Any, None) for k in keys}
    return create_model(name, __base__=Section, **fields)  # type: ignore[no-any-return, call-overload]


TensorParallelConfig = _keys_only(
    "TensorParallelConfig",
    (
        "dtype",
        "autotp_size",
        "tp_overlap_comm",
        "vocab_parallel_lm_head",
        "vocab_parallel_ce_backend",
        "tensor_parallel",
        "tp",
        "injection_policy_tuple",
        "partition_config",
        "keep_module_on_host",
        "preset_model",
    ),
)
WeightQuantizationConfig = _keys_only(
    "WeightQuantizationConfig",
    ("enabled", "num_bits", "q_groups", "q_type", "quantized_initialization", "post_init_quant"),
)

__all__ = [
    "CometConfig",
    "CompileConfig",
    "HybridEngineConfig",
    "LeafModuleConfig",
    "TensorParallelConfig",
    "ThroughputTimerConfig",
    "TimersConfig",
    "WeightQuantizationConfig",
    "ZenFlowConfig",
]


# -- sections DeepSpeed reads key by key (unknown keys are ignored there, with a warning) ----------

_DTYPES = frozenset(
    {
        "torch.float16",
        "fp16",
        "float16",
        "half",
        "torch.float32",
        "fp32",
        "float32",
        "float",
        "torch.int8",
        "int8",
        "torch.bfloat16",
        "bf16",
        "bfloat16",
    }
)


class TorchAutocastConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    enabled: bool = False
    dtype: str | None = None
    lower_precision_safe_modules: list[str] | None = None

    @model_validator(mode="after")
    def _dtype(self) -> TorchAutocastConfig:
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ValueError(
                f"dtype {self.dtype!r} is not a dtype name; use bfloat16, float16 or float32"
            )
        return self


class DataTypesConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    grad_accum_dtype: str | None = None
    param_dtype: str | None = None
    buffer_dtype: str | None = None
    keep_in_fp32_modules: Literal["auto"] | list[str] = "auto"


class FlopsProfilerConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    enabled: bool = False
    recompute_fwd_factor: float = 0.0
    profile_step: Int = 1
    module_depth: Int = -1
    top_modules: Int = 1
    detailed: bool = True
    output_file: str | None = None
