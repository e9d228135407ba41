"""The ``zero_optimization`` section: ZeRO stages, buckets, the stage-3 knobs and both offloads.

DeepSpeed's ZeRO-3 keys have two spellings (``stage3_`` prefixed and bare) and some deprecated
names; the alternatives are validation aliases. Re-exported by :mod:`ds.zero.config.sections`.
"""

from __future__ import annotations

import sys
from typing import Any, Literal

from pydantic import AliasChoices, Field, model_validator

from ds.zero.config.base import Section, drop_autos
from ds.zero.config.sections_aux import LeafModuleConfig, ZenFlowConfig
from ds.zero.config.types import Int, IntOrAuto


def _alias(*names: str) -> Any:
    return Field(validation_alias=AliasChoices(*names))


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


__all__ = ["OffloadOptimizerConfig", "OffloadParamConfig", "ZeroConfig"]
