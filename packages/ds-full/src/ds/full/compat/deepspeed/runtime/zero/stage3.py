"""``deepspeed.runtime.zero.stage3``: ``DeepSpeedZeroOptimizer_Stage3`` (the class an engine's
optimizer is at ZeRO stage 3, for ``isinstance``) and DeepSpeed's stage-3 memory estimate."""

from __future__ import annotations

from typing import Any

from ds.autotune.formulas import deepspeed_estimate
from ds.full.compat.deepspeed.runtime.zero._optimizer_class import ZeroOptimizerClass, refuse


class DeepSpeedZeroOptimizer_Stage3(metaclass=ZeroOptimizerClass):
    stages = (3,)
    __new__ = refuse  # type: ignore[assignment]


def estimate_zero3_model_states_mem_needs(
    total_params: int,
    largest_layer_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int, int]:
    """DeepSpeed's (host bytes, device bytes, largest layer bytes) of ZeRO-3 model states."""
    est = deepspeed_estimate(
        total_params, largest_layer_params, 3, num_gpus_per_node, num_nodes, cpu_offload,
        cpu_offload_params, zero_init, additional_buffer_factor,
    )  # fmt: skip
    assert est is not None
    return est[0], est[1], 4 * largest_layer_params


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"deepspeed.runtime.zero.stage3.{name}: DeepSpeed's ZeRO-3 internals have no ds "
        "equivalent (ds.zero.stage3 implements ZeRO-3)"
    )


__all__ = ["DeepSpeedZeroOptimizer_Stage3", "estimate_zero3_model_states_mem_needs"]
