"""DeepSpeed's documented example configs load; documented-but-unimplemented keys warn once."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from ds.zero.config import UnimplementedConfigWarning, load_config, resolve

# Written from the key names of DeepSpeed's config documentation and tutorials.
DOCUMENTED: dict[str, dict[str, Any]] = {
    "getting-started": {
        "train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 0},
    },
    "fp16-dynamic-scaling": {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 100,
        "gradient_clipping": 1.0,
        "fp16": {
            "enabled": True,
            "auto_cast": False,
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "consecutive_hysteresis": False,
            "min_loss_scale": 1,
        },
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000},
        },
        "wall_clock_breakdown": False,
    },
    "zero2-offload": {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 4,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 2,
            "allgather_partitions": True,
            "allgather_bucket_size": 5e8,
            "overlap_comm": True,
            "reduce_scatter": True,
            "reduce_bucket_size": 5e8,
            "contiguous_gradients": True,
            "round_robin_gradients": False,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 3e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
        },
    },
    "zero3-offload-nvme": {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "contiguous_gradients": True,
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_prefetch_bucket_size": 1e7,
            "stage3_param_persistence_threshold": 1e5,
            "reduce_bucket_size": 1e7,
            "sub_group_size": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
            "offload_optimizer": {
                "device": "nvme",
                "nvme_path": "/local_nvme",
                "pin_memory": True,
                "buffer_count": 4,
                "fast_init": False,
            },
            "offload_param": {
                "device": "nvme",
                "nvme_path": "/local_nvme",
                "pin_memory": True,
                "buffer_count": 5,
                "buffer_size": 1e8,
                "max_in_cpu": 1e9,
            },
        },
        "aio": {
            "block_size": 1048576,
            "queue_depth": 8,
            "thread_count": 1,
            "single_submit": False,
            "overlap_events": True,
        },
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
    },
    "zero3-unprefixed-and-deprecated-keys": {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {
            "stage": 3,
            "prefetch_bucket_size": 5e7,
            "param_persistence_threshold": 1e4,
            "stage3_gather_fp16_weights_on_model_save": True,
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    },
    "deprecated-cpu-offload": {
        "train_batch_size": 16,
        "zero_optimization": {"stage": 2, "cpu_offload": True},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
    },
    "one-cycle": {
        "train_batch_size": 16,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}},
        "scheduler": {
            "type": "OneCycle",
            "params": {
                "cycle_first_step_size": 1000,
                "cycle_first_stair_count": 500,
                "cycle_second_step_size": 1000,
                "cycle_second_stair_count": 500,
                "decay_step_size": 1000,
                "cycle_min_lr": 0.0001,
                "cycle_max_lr": 0.0010,
                "decay_lr_rate": 0.001,
                "cycle_min_mom": 0.85,
                "cycle_max_mom": 0.99,
                "decay_mom_rate": 0.0,
            },
        },
    },
    "lr-range-test": {
        "train_batch_size": 16,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        "scheduler": {
            "type": "LRRangeTest",
            "params": {
                "lr_range_test_min_lr": 0.0001,
                "lr_range_test_step_size": 200,
                "lr_range_test_step_rate": 5,
                "lr_range_test_staircase": False,
            },
        },
    },
    "warmup-decay-cosine": {
        "train_batch_size": 16,
        "optimizer": {
            "type": "Lion",
            "params": {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.0},
        },
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": 10000,
                "warmup_min_ratio": 0.0,
                "warmup_num_steps": 100,
                "cos_min_ratio": 0.0001,
            },
        },
    },
    "activation-checkpointing-and-monitors": {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 4,
        "activation_checkpointing": {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        },
        "comms_logger": {"enabled": True, "verbose": False, "prof_all": True, "debug": False},
        "csv_monitor": {"enabled": True, "output_path": "logs/", "job_name": "run"},
        "checkpoint": {
            "tag_validation": "Warn",
            "load_universal": False,
            "use_node_local_storage": False,
        },
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "Adagrad", "params": {"lr": 0.01}},
    },
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_documented_example_loads(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnimplementedConfigWarning)
        cfg = load_config(DOCUMENTED[name])
    resolved = resolve(cfg, 2)
    assert resolved.train_batch_size == (
        resolved.train_micro_batch_size_per_gpu * resolved.gradient_accumulation_steps * 2
    )


def test_aliases_land_on_one_field() -> None:
    a = load_config(DOCUMENTED["zero3-unprefixed-and-deprecated-keys"]).zero_optimization
    assert a.prefetch_bucket_size == 50_000_000
    assert a.param_persistence_threshold == 10_000
    assert a.gather_16bit_weights_on_model_save is True
    assert a.max_live_parameters == 1_000_000_000  # default when neither spelling is given
    b = load_config(DOCUMENTED["zero3-offload-nvme"])
    assert b.aio.intra_op_parallelism == 1 and b.zero_optimization.max_reuse_distance == 10**9
    c = load_config(DOCUMENTED["deprecated-cpu-offload"]).zero_optimization
    assert c.offload_optimizer_device == "cpu"


def test_unimplemented_keys_give_one_warning_naming_them() -> None:
    cfg = {
        "train_batch_size": 8,
        "autotuning": {"enabled": True},
        "dump_state": True,
        "hybrid_engine": {"enabled": True, "max_out_tokens": 64},
        "wandb": {"enabled": False},
        "zero_optimization": {"stage": 2, "round_robin_gradients": True},
        "prescale_gradients": True,
        "fp16": {"enabled": True, "auto_cast": True},
    }
    with pytest.warns(UnimplementedConfigWarning) as record:
        load_config(cfg)
    assert len(record) == 1
    text = str(record[0].message)
    for key in (
        "autotuning",
        "dump_state",
        "hybrid_engine",
        "zero_optimization.round_robin_gradients",
    ):
        assert key in text
    assert "wandb" not in text  # disabled sections are not reported


def test_repository_example_configs_load() -> None:
    root = Path(__file__).resolve().parents[3] / "examples"
    paths = sorted(root.glob("ds_config_*.json"))
    assert paths, "examples/ds_config_*.json are missing"
    for path in paths:
        resolve(load_config(str(path)), 2)
    assert (
        json.loads((root / "ds_config_zero2.json").read_text())["zero_optimization"]["stage"] == 2
    )
