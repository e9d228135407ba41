"""Closed-form model-state bytes: ds's per-stage accounting and DeepSpeed's estimator formulae.

For mixed-precision Adam with Ψ parameters on N data-parallel ranks (ZeRO paper, section 3):
16Ψ at stage 0, 4Ψ + 12Ψ/N at stage 1, 2Ψ + 14Ψ/N at stage 2, 16Ψ/N at stage 3; fp32 training
keeps no separate master copy (4Ψ weights + 4Ψ grads + 8Ψ Adam state, the same 16Ψ split the same
way). DeepSpeed's formulae (``estimate_zero2_model_states_mem_needs``,
``estimate_zero3_model_states_mem_needs``) are reproduced to compare with; they include its
``additional_buffer_factor`` on the host and a largest-layer term at stage 3.
"""

from __future__ import annotations


def model_state_bytes(params: int, stage: int, world: int, offload_optimizer: bool = False) -> int:
    """ds's device bytes of model states per rank for mixed-precision Adam."""
    p, n = params, max(1, world)
    if offload_optimizer:
        # masters and Adam state on the host; the device keeps the 2-byte params (stage 3: a
        # shard) and, at stage 1, the 2-byte gradients (stage 2-3 move reduced ones to the host)
        return {0: 4 * p, 1: 4 * p, 2: 2 * p, 3: 2 * p // n}[stage]
    return {0: 16 * p, 1: 4 * p + 12 * p // n, 2: 2 * p + 14 * p // n, 3: 16 * p // n}[stage]


def deepspeed_estimate(
    params: int,
    largest_layer_params: int,
    stage: int,
    gpus_per_node: int,
    nodes: int,
    offload_optimizer: bool,
    offload_param: bool = False,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int] | None:
    """DeepSpeed 0.19.8's (host bytes, device bytes) estimate; ``None`` for stages 0-1, which
    it has no estimator for."""
    total_gpus = nodes * gpus_per_node
    if stage == 2:
        if offload_optimizer:
            gpu = 2 * params
            cpu = params * max(4 * total_gpus, 16) * additional_buffer_factor
        else:
            gpu = 2 * params + int(18 * params / total_gpus)
            cpu = params * 4 * gpus_per_node * additional_buffer_factor
        return int(cpu), int(gpu)
    if stage == 3:
        gpus_factor = 1 / nodes
        largest = 4 * largest_layer_params
        if offload_optimizer:
            if offload_param:
                gpu = largest
                factor = 18 * gpus_factor if zero_init else max(4 * gpus_per_node, 18 * gpus_factor)
            else:
                gpu = largest + int(2 * params / total_gpus)
                factor = 16 * gpus_factor if zero_init else max(4 * gpus_per_node, 16 * gpus_factor)
            cpu = params * factor * additional_buffer_factor
        else:
            gpu = largest + int(18 * params / total_gpus)
            cpu = (largest_layer_params if zero_init else params) * 4 * gpus_per_node
            cpu *= additional_buffer_factor
        return int(cpu), int(gpu)
    return None
