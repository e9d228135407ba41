"""DeepSpeed config keys ds knows but does not act on yet.

A config that sets one of them loads (so existing configs keep working) and produces one warning
naming every such key, so nobody believes a feature is on when it is not.
"""

from __future__ import annotations

# Top-level sections and keys documented by DeepSpeed that ds accepts without acting on them.
TOP_LEVEL: frozenset[str] = frozenset(
    {
        "amp",
        "autotuning",
        "comet",
        "compile",
        "compression_training",
        "curriculum_learning",
        "data_efficiency",
        "data_types",
        "dataloader_drop_last",
        "disable_allgather",
        "dump_state",
        "eigenvalue",
        "elasticity",
        "flops_profiler",
        "graph_harvesting",
        "hybrid_engine",
        "memory_breakdown",
        "nebula",
        "pipeline",
        "progressive_layer_drop",
        "quantize_training",
        "sequence_parallel_size",
        "seq_parallel_communication_data_type",
        "sparse_attention",
        "sparse_gradients",
        "tensor_parallel",
        "tensorboard",
        "timers",
        "torch_autocast",
        "use_data_before_expert_parallelism",
        "wandb",
        "weight_quantization",
        "zero_force_ds_cpu_optimizer",
    }
)

# zero_optimization keys ds accepts but does not act on (value != default triggers the warning).
ZERO_KEYS_DEFAULTS: dict[str, object] = {
    "round_robin_gradients": False,
    "zero_hpz_partition_size": 1,
    "zero_quantized_weights": False,
    "zero_quantized_nontrainable_weights": False,
    "zero_quantized_gradients": False,
    "zeropp_loco_param": None,
    "mics_shard_size": -1,
    "mics_hierarchical_params_gather": False,
    "legacy_stage1": False,
    "elastic_checkpoint": False,
}

# Nested keys ds accepts but does not act on yet: warned about when set to anything but the default.
NESTED_DEFAULTS: dict[tuple[str, ...], object] = {
    ("fp16", "auto_cast"): False,
    ("fp16", "fp16_master_weights_and_grads"): False,
    ("bf16", "immediate_grad_update"): False,
    ("checkpoint", "load_universal"): False,
    ("checkpoint", "use_node_local_storage"): False,
    ("zero_optimization", "offload_optimizer", "ratio"): 1.0,
}

# Gradient-reduction keys stages 0-2 honour but stage 3 does not act on yet (warned at stage 3).
STAGE3_DEFAULTS: dict[tuple[str, ...], object] = {
    ("prescale_gradients",): False,
    ("gradient_predivide_factor",): 1.0,
    ("communication_data_type",): None,
}
