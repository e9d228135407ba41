"""Record DeepSpeed 0.19.8's accept/reject verdict on documented and mutated training configs.

Run with a DeepSpeed environment (never the ds dev venv):

    DS_ACCELERATOR=cpu /path/to/deepspeed-env/bin/python tools/deepspeed_verdicts.py \
        > packages/zero-runtime/tests/fixtures/deepspeed_verdicts.json

The verdict is what ``deepspeed.initialize`` would decide about the config before training:
``DeepSpeedConfig(config)`` (its pydantic sections, batch checks and removed-key checks, built
without a process group, as for world size 1), then the optimizer and scheduler that the engine
would build from the config's ``optimizer``/``scheduler`` sections: scheduler classes from
``deepspeed.runtime.lr_schedules`` (or ``torch.optim.lr_scheduler``) are constructed for real on a
dummy optimizer; torch optimizers are constructed for real; DeepSpeed's fused/CPU optimizers, whose
kernels do not load on CPU, have their keyword arguments bound to their signatures.

The test ``packages/zero-runtime/tests/test_config_deepspeed_parity.py`` loads every recorded
config with ds's loader and compares. The mutations are seeded, so reruns reproduce the file.
"""

from __future__ import annotations

import copy
import inspect
import json
import random
import sys
from typing import Any

SEED = 18
MUTATIONS = 640

# DeepSpeed's documented example configs (config-json reference, tutorials, and the
# transformers/DeepSpeed ZeRO examples with their "auto" values filled as the Trainer fills them),
# plus the public fine-tuning configs that use newer keys.
DOCUMENTED: dict[str, dict[str, Any]] = {
    "getting-started": {
        "train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
        "fp16": {"enabled": True},
        "zero_optimization": True,
    },
    "config-json-fp16": {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 100,
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "gradient_predivide_factor": 1.0,
        "wall_clock_breakdown": False,
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
            "type": "Adam",
            "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000},
        },
    },
    "zero2-offload-bf16": {
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
    "hf-zero2-filled": {
        "fp16": {
            "enabled": False,
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        "bf16": {"enabled": True},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
        },
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": 0,
                "warmup_max_lr": 5e-5,
                "warmup_num_steps": 10,
                "total_num_steps": 100,
            },
        },
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "allgather_partitions": True,
            "allgather_bucket_size": 2e8,
            "overlap_comm": True,
            "reduce_scatter": True,
            "reduce_bucket_size": 2e8,
            "contiguous_gradients": True,
        },
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 2000,
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 8,
        "wall_clock_breakdown": False,
    },
    "hf-zero3-filled": {
        "bf16": {"enabled": True},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 5e-5, "warmup_num_steps": 10},
        },
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True,
            "contiguous_gradients": True,
            "sub_group_size": 1e9,
            "reduce_bucket_size": 589824,
            "stage3_prefetch_bucket_size": 530841,
            "stage3_param_persistence_threshold": 7680,
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "steps_per_print": 2000,
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "wall_clock_breakdown": False,
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
    "one-cycle-sgd": {
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
    "warmup-cosine-lion": {
        "train_batch_size": 16,
        "optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99]}},
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
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 4,
        "activation_checkpointing": {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        },
        "comms_logger": {"enabled": True, "verbose": False, "prof_all": True, "debug": False},
        "tensorboard": {"enabled": True, "output_path": "logs/", "job_name": "run"},
        "csv_monitor": {"enabled": True, "output_path": "logs/", "job_name": "run"},
        "wandb": {"enabled": False, "project": "p"},
        "flops_profiler": {
            "enabled": False,
            "profile_step": 1,
            "module_depth": -1,
            "top_modules": 1,
            "detailed": True,
            "output_file": None,
        },
        "checkpoint": {"tag_validation": "Warn", "load_universal": False},
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "Adagrad", "params": {"lr": 0.01}},
    },
    "public-bf16-zero2-newer-keys": {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 8,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True, "bf16_master_weights_and_grads": False},
        "zero_optimization": {
            "stage": 2,
            "sub_group_size": 0,
            "overlap_comm": False,
            "reduce_bucket_size": 5e8,
            "contiguous_gradients": True,
        },
        "comms_config": {"verbose": False},
        "monitor_config": {"enabled": False},
        "fp8": {"enabled": False},
    },
    "public-zero3-zenflow": {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "zenflow": {
                "topk_ratio": 0.05,
                "select_strategy": "auto",
                "select_interval": "auto",
                "update_interval": 4,
                "full_warm_up_rounds": 0,
                "overlap_step": True,
            },
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "weight_decay": 0.0}},
    },
    "compile-timers-hybrid": {
        "train_batch_size": 4,
        "compile": {"deepcompile": False},
        "timers": {"throughput": {"enabled": True, "synchronized": False}},
        "hybrid_engine": {"enabled": False, "max_out_tokens": 512},
        "communication_data_type": "bf16",
        "data_types": {"grad_accum_dtype": "fp32"},
        "dataloader_drop_last": False,
        "memory_breakdown": False,
        "torch_autocast": {"enabled": False},
    },
}

UNKNOWN_NAMES = [
    "comms_config",
    "monitor_config",
    "fp8",
    "enable",
    "bucket_size",
    "verbose_logging",
    "my_custom_key",
    "stage4",
]
KNOWN_ADDITIONS: list[tuple[tuple[str, ...], Any]] = [
    (("bf16", "bf16_master_weights_and_grads"), True),
    (("bf16", "bf16_optimizer_states"), True),
    (("bf16", "check_grad_overflow"), False),
    (("zero_optimization", "zenflow"), {"topk_ratio": 0.1}),
    (("zero_optimization", "zenflow"), {"topk_ratio": 1.5}),
    (("zero_optimization", "sub_group_size"), 0),
    (("zero_optimization", "stage3_allgather_sequential"), True),
    (("zero_optimization", "compute_grad_norm"), False),
    (("zero_optimization", "parameter_alignment"), True),
    (("zero_optimization", "enable_sanity_checks"), True),
    (("zero_optimization", "leaf_module"), {"names": ["block"]}),
    (("zero_optimization", "zero_hpz_partition_size"), 0),
    (("zero_optimization", "mics_shard_size"), 2),
    (("zero_optimization", "zeropp_loco_param"), {"err_beta": 0.8}),
    (("zero_optimization", "offload_optimizer"), {"device": "cpu", "ratio": 0.5}),
    (("zero_optimization", "offload_optimizer"), {"device": "cpu", "super_offload": True}),
    (("gradient_allreduce_op",), "sum"),
    (("gradient_allreduce_op",), "max"),
    (("communication_data_type",), "int8"),
    (("nebula",), {"enabled": False}),
    (("elasticity",), {"enabled": False}),
    (("amp",), {"enabled": False}),
    (("sparse_gradients",), False),
    (("curriculum_learning",), {"enabled": False}),
    (("comet",), {"enabled": False, "project": "x"}),
    (("checkpoint",), {"tag_validation": "Sometimes"}),
    (("checkpoint",), {"parallel_write": {"pipeline_stage": 1}}),
    (("fp16",), {"enabled": True, "loss_scale_window": 0}),
    (("fp16",), {"enabled": True, "loss_scale": -1}),
    (("fp16",), {"enabled": True, "min_loss_scale": 0.5}),
    (("hybrid_engine",), {"enabled": True, "max_out_tokens": 0}),
    (("timers",), {"throughput": {"enabled": "yes please"}}),
    (("data_types",), {"keep_in_fp32_modules": 3}),
    (("torch_autocast",), {"enabled": True, "dtype": "bfloat16"}),
    (("torch_autocast",), {"enabled": True, "dtype": "int4"}),
]


def _nodes(cfg: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out: list[tuple[tuple[str, ...], Any]] = []
    if isinstance(cfg, dict):
        for key, value in cfg.items():
            path = (*prefix, key)
            out.append((path, value))
            out.extend(_nodes(value, path))
    return out


def _dicts(cfg: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix] if isinstance(cfg, dict) else []
    if isinstance(cfg, dict):
        for key, value in cfg.items():
            out.extend(_dicts(value, (*prefix, key)))
    return out


def _get(cfg: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = cfg
    for part in path:
        node = node[part]
    return node


def _set(cfg: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = cfg
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def _misspell(rng: random.Random, key: str) -> str:
    kind = rng.choice(["drop", "swap", "double", "case", "underscore", "plural"])
    if kind == "drop" and len(key) > 3:
        i = rng.randrange(len(key))
        return key[:i] + key[i + 1 :]
    if kind == "swap" and len(key) > 3:
        i = rng.randrange(len(key) - 1)
        return key[:i] + key[i + 1] + key[i] + key[i + 2 :]
    if kind == "double":
        i = rng.randrange(len(key))
        return key[:i] + key[i] + key[i:]
    if kind == "case":
        return key.title().replace("_", "") if "_" in key else key.upper()
    if kind == "underscore":
        return key.replace("_", "-") if "_" in key else key + "_"
    return key + "s"


def _value_mutation(rng: random.Random, value: Any) -> tuple[str, Any]:
    if isinstance(value, bool):
        return rng.choice(
            [("auto", "auto"), ("string", "maybe"), ("int-for-bool", 2), ("null", None)]
        )
    if isinstance(value, int | float):
        choices: list[tuple[str, Any]] = [
            ("auto", "auto"),
            ("negative", -abs(value) - 1),
            ("zero", 0),
            ("float-for-int", float(value) if float(value) != 0 else 1e9),
            ("1e9", 1e9),
            ("fraction", float(value) + 0.5),
            ("string", "many"),
            ("numeric-string", str(value)),
            ("list", [value]),
            ("null", None),
            ("bool", True),
        ]
        return rng.choice(choices)
    if isinstance(value, str):
        return rng.choice([("auto", "auto"), ("other-string", value + "x"), ("int", 7)])
    if isinstance(value, list):
        return rng.choice([("auto", "auto"), ("empty-list", []), ("scalar", 0.9)])
    if isinstance(value, dict):
        return rng.choice([("auto", "auto"), ("empty", {}), ("bool-for-section", True)])
    return ("string", "x")


def mutate(rng: random.Random, base: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    cfg = copy.deepcopy(base)
    kind = rng.choice(["drop", "rename", "unknown", "value", "value", "value", "known"])
    nodes = _nodes(cfg)
    if kind == "drop":
        path, _ = rng.choice(nodes)
        parent = _get(cfg, path[:-1]) if path[:-1] else cfg
        del parent[path[-1]]
        return f"drop {'.'.join(path)}", cfg
    if kind == "rename":
        path, value = rng.choice(nodes)
        parent = _get(cfg, path[:-1]) if path[:-1] else cfg
        new = _misspell(rng, path[-1])
        if new == path[-1]:
            new = path[-1] + "_"
        del parent[path[-1]]
        parent[new] = value
        return f"rename {'.'.join(path)} -> {new}", cfg
    if kind == "unknown":
        where = rng.choice(_dicts(cfg))
        name = rng.choice(UNKNOWN_NAMES)
        value = rng.choice([True, 1, {"enabled": False}, "x"])
        _set(cfg, (*where, name), value)
        return f"add unknown {'.'.join((*where, name))}={value!r}", cfg
    if kind == "known":
        path, value = rng.choice(KNOWN_ADDITIONS)
        _set(cfg, path, copy.deepcopy(value))
        return f"set {'.'.join(path)}={value!r}", cfg
    scalars = [(p, v) for p, v in nodes if not isinstance(v, dict)] or nodes
    path, value = rng.choice(scalars)
    label, new = _value_mutation(rng, value)
    _set(cfg, path, new)
    return f"value {'.'.join(path)}: {label} {new!r}", cfg


# -- DeepSpeed's verdict ---------------------------------------------------------------------------


def _optimizer_class(ds_config: Any) -> tuple[Any, bool]:
    """The class the engine would build for the config's optimizer and whether it can be
    constructed here (torch classes) or only have its arguments bound (kernels not loadable)."""
    import torch
    from deepspeed.runtime import config as dsc

    name = ds_config.optimizer_name
    offload = ds_config.zero_config.offload_optimizer is not None and str(
        getattr(ds_config.zero_config.offload_optimizer.device, "value", None)
        or ds_config.zero_config.offload_optimizer.device
    ) in ("cpu", "nvme")
    if name in (dsc.ADAM_OPTIMIZER, dsc.ADAMW_OPTIMIZER):
        params = ds_config.optimizer_params or {}
        if params.get("torch_adam"):
            return torch.optim.AdamW, True
        if offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam, False
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam, False
    if name == dsc.ADAGRAD_OPTIMIZER:
        if offload:
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

            return DeepSpeedCPUAdagrad, False
        return torch.optim.Adagrad, True
    if name == dsc.LION_OPTIMIZER:
        if offload:
            from deepspeed.ops.lion import DeepSpeedCPULion

            return DeepSpeedCPULion, False
        from deepspeed.ops.lion import FusedLion

        return FusedLion, False
    if name in (
        dsc.LAMB_OPTIMIZER,
        dsc.MUADAM_OPTIMIZER,
        dsc.MUADAMW_OPTIMIZER,
        dsc.MUSGD_OPTIMIZER,
    ):
        return None, False
    return getattr(torch.optim, name), True


def _check_optimizer(ds_config: Any) -> Any:
    import torch

    if ds_config.optimizer_name is None:
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    params = dict(ds_config.optimizer_params or {})
    if "max_grad_norm" in params:
        raise ValueError("'max_grad_norm' is not supported as an optimizer parameter")
    cls, constructible = _optimizer_class(ds_config)
    for key in ("adam_w_mode", "torch_adam", "fp32_optimizer_states"):
        if ds_config.optimizer_name in ("adam", "adamw"):
            params.pop(key, None)
    if ds_config.optimizer_name in ("adam", "adamw") and cls is torch.optim.AdamW:
        params.pop("bias_correction", None)
    p = torch.nn.Parameter(torch.zeros(2))
    if cls is None:
        return torch.optim.SGD([p], lr=0.1)
    if constructible:
        return cls([p], **params)
    inspect.signature(cls.__init__).bind(None, [p], **params)
    if cls.__name__ == "FusedAdam" and params.get("amsgrad"):
        raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
    lr = params.get("lr", 1e-3)
    return torch.optim.SGD([p], lr=lr if isinstance(lr, int | float) and lr >= 0 else 0.1)


def _check_scheduler(ds_config: Any, optimizer: Any) -> None:
    import torch
    from deepspeed.runtime import lr_schedules

    name = ds_config.scheduler_name
    if name is None:
        return
    if hasattr(lr_schedules, name):
        cls = getattr(lr_schedules, name)
    else:
        assert hasattr(torch.optim.lr_scheduler, name), f"unknown LR scheduler {name}"
        cls = getattr(torch.optim.lr_scheduler, name)
    cls(optimizer, **(ds_config.scheduler_params or {}))


def verdict(cfg: dict[str, Any]) -> tuple[str, str, str]:
    """(accept|reject, stage, first line of the error)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    stage = "config"
    try:
        ds_config = DeepSpeedConfig(copy.deepcopy(cfg))
        stage = "optimizer"
        optimizer = _check_optimizer(ds_config)
        stage = "scheduler"
        _check_scheduler(ds_config, optimizer)
    except Exception as exc:  # every failure is a rejection; its text is recorded
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()
        return "reject", stage, " ".join(line.strip() for line in text[:3])[:300]
    return "accept", "", ""


def main() -> None:
    import logging

    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    rng = random.Random(SEED)
    cases: list[dict[str, Any]] = []
    for name, cfg in DOCUMENTED.items():
        cases.append({"name": name, "base": name, "mutation": "documented", "config": cfg})
    names = list(DOCUMENTED)
    seen: set[str] = set()
    while len(cases) < len(DOCUMENTED) + MUTATIONS:
        base = rng.choice(names)
        label, cfg = mutate(rng, DOCUMENTED[base])
        key = json.dumps(cfg, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        cases.append(
            {"name": f"{base}/{len(cases)}", "base": base, "mutation": label, "config": cfg}
        )
    for case in cases:
        result, stage, error = verdict(case["config"])
        case["deepspeed"] = result
        case["stage"] = stage
        case["error"] = error
    out = {
        "deepspeed_version": deepspeed.__version__,
        "generator": "tools/deepspeed_verdicts.py",
        "seed": SEED,
        "cases": cases,
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
