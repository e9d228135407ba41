"""``deepspeed.runtime.zero.stage_1_and_2``: ``DeepSpeedZeroOptimizer`` (the class an engine's
optimizer is at ZeRO stages 1-2, for ``isinstance``) and DeepSpeed's stage-2 memory estimate."""

from __future__ import annotations

from typing import Any

import torch

from ds.autotune.formulas import deepspeed_estimate
from ds.full.compat.deepspeed.runtime.zero._optimizer_class import ZeroOptimizerClass, refuse


class DeepSpeedZeroOptimizer(metaclass=ZeroOptimizerClass):
    stages = (1, 2)
    __new__ = refuse  # type: ignore[assignment]


def estimate_zero2_model_states_mem_needs(
    total_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int]:
    """DeepSpeed's (host bytes, device bytes) of ZeRO-2 model states (``ds estimate`` gives ds's
    own, measured accounting)."""
    est = deepspeed_estimate(
        total_params, 0, 2, num_gpus_per_node, num_nodes, cpu_offload,
        additional_buffer_factor=additional_buffer_factor,
    )  # fmt: skip
    assert est is not None
    return est


def model_to_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def estimate_zero2_model_states_mem_needs_all_cold(
    total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
    additional_buffer_factor: float = 1.5,
) -> None:  # fmt: skip
    """Print DeepSpeed's ZeRO-2 estimate with and without optimizer offload."""
    gib = 2**30
    print(f"Estimated memory needed for params, optim states and gradients for a:\n"
          f"HW: Setup with {num_nodes} node(s), {num_gpus_per_node} GPU(s) per node.\n"
          f"SW: Model with {int(total_params / 1e6)}M total params.")  # fmt: skip
    print("  per CPU  |  per GPU |   Options")
    for offload in (True, False):
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            total_params, num_gpus_per_node, num_nodes, offload, additional_buffer_factor
        )
        print(
            f" {cpu / gib:7.2f}GB | {gpu / gib:6.2f}GB | offload_optimizer={'cpu' if offload else 'none'}"
        )


def estimate_zero2_model_states_mem_needs_all_live(
    model: torch.nn.Module, num_gpus_per_node: int = 1, num_nodes: int = 1,
    additional_buffer_factor: float = 1.5,
) -> None:  # fmt: skip
    estimate_zero2_model_states_mem_needs_all_cold(
        model_to_params(model), num_gpus_per_node, num_nodes, additional_buffer_factor
    )


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"deepspeed.runtime.zero.stage_1_and_2.{name}: DeepSpeed's ZeRO-1/2 internals have no "
        "ds equivalent (ds.zero.stages implements ZeRO 0-2)"
    )


__all__ = [
    "DeepSpeedZeroOptimizer",
    "estimate_zero2_model_states_mem_needs",
    "estimate_zero2_model_states_mem_needs_all_cold",
    "estimate_zero2_model_states_mem_needs_all_live",
    "model_to_params",
]
