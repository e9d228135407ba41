"""DeepSpeed config keys ds knows but does not act on yet.

A config that sets one of them loads (so existing configs keep working) and produces one warning
naming every such key, so nobody believes a feature is on when it is not.
"""

from __future__ import annotations

# Top-level sections and keys documented by DeepSpeed that ds accepts without acting on them.
TOP_LEVEL: frozenset[str] = frozenset(
    {
        "autotuning",
        "data_efficiency",
        "dataloader_drop_last",
        "datastates_ckpt",
        "disable_allgather",
        "disable_python_gc",
        "dump_state",
        "hybrid_engine",
        "memory_breakdown",
        "seq_parallel_communication_data_type",
        "torch_autocast",
        "use_data_before_expert_parallelism",
        "vocabulary_size",
        "weight_quantization",
    }
)

# zero_optimization keys ds accepts but does not act on (value != default triggers the warning).
ZERO_KEYS_DEFAULTS: dict[str, object] = {
    "round_robin_gradients": False,
    "zero_hpz_partition_size": 1,
    "zero_quantized_weights": False,
    "zero_quantized_nontrainable_weights": False,
    "zero_quantized_gradients": False,
    "legacy_stage1": False,
    "elastic_checkpoint": False,
    "zenflow": None,
    "compute_grad_norm": True,
    "parameter_alignment": False,
    "enable_sanity_checks": False,
    "save_muon_momentum_buffer_in_memory": False,
    "stage3_allgather_sequential": False,
    "allgather_sequential": False,
}

# Nested keys ds accepts but does not act on yet: warned about when set to anything but the default.
NESTED_DEFAULTS: dict[tuple[str, ...], object] = {
    ("fp16", "auto_cast"): False,
    ("fp16", "fp16_master_weights_and_grads"): False,
    ("bf16", "immediate_grad_update"): False,
    ("bf16", "bf16_master_weights_and_grads"): False,
    ("bf16", "bf16_optimizer_states"): False,
    ("compile", "deepcompile"): False,
    ("zero_optimization", "offload_optimizer", "super_offload"): False,
    ("checkpoint", "load_universal"): False,
    ("checkpoint", "use_node_local_storage"): False,
    ("zero_optimization", "offload_optimizer", "ratio"): 1.0,
    # data_types.grad_accum_dtype (stages 0-1 accumulate in it), param_dtype (checked against the
    # precision mode) and buffer_dtype (the buffers' cast) are honoured; the rest is not yet.
    ("data_types", "keep_in_fp32_modules"): "auto",
}

# Gradient-reduction keys stages 0-2 honour but stage 3 does not act on yet (warned at stage 3).
STAGE3_DEFAULTS: dict[tuple[str, ...], object] = {
    ("prescale_gradients",): False,
    ("gradient_predivide_factor",): 1.0,
    ("communication_data_type",): None,
    ("data_types", "grad_accum_dtype"): None,
}
