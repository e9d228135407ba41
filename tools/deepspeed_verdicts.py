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
from pathlib import Path
from typing import Any

SEED = 18
MUTATIONS = 640

# DeepSpeed's documented example configs (config-json reference, tutorials, and the
# transformers/DeepSpeed ZeRO examples with their "auto" values filled as the Trainer fills them),
# plus the public fine-tuning configs that use newer keys.
# The documented example configs (shared with ds's own config tests); mutations start from these,
# in this order (the order and the seed fix the verdict fixture).
MUTATION_BASES = (
    "getting-started",
    "config-json-fp16",
    "zero2-offload-bf16",
    "zero3-offload-nvme",
    "hf-zero2-filled",
    "hf-zero3-filled",
    "zero3-unprefixed-and-deprecated-keys",
    "deprecated-cpu-offload",
    "one-cycle-sgd",
    "lr-range-test",
    "warmup-cosine-lion",
    "activation-checkpointing-and-monitors",
    "public-bf16-zero2-newer-keys",
    "public-zero3-zenflow",
    "compile-timers-hybrid",
)
_EXAMPLES = json.loads(
    (
        Path(__file__).resolve().parents[1]
        / "packages/zero-runtime/tests/fixtures/documented_configs.json"
    ).read_text()
)
DOCUMENTED: dict[str, dict[str, Any]] = {name: _EXAMPLES[name] for name in MUTATION_BASES}

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
