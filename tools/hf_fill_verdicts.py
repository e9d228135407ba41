"""Record how transformers fills "auto" in DeepSpeed configs and which mismatches it refuses.

Run with an environment that has transformers, accelerate and DeepSpeed (never the ds dev venv):

    DS_ACCELERATOR=cpu /path/to/env/bin/python tools/hf_fill_verdicts.py \
        > tests/integrations/fixtures/hf_fill_verdicts.json

Each case runs ``HfTrainerDeepSpeedConfig.trainer_config_process`` then
``trainer_config_finalize`` (the two passes ``Trainer`` makes) and records the filled config, or
the config keys it reported as mismatching ``TrainingArguments``.
``tests/integrations/test_hf_config.py`` checks that ``ds.integrations.hf`` fills and refuses the
same. The cases are seeded, so reruns reproduce the file.
"""

from __future__ import annotations

import copy
import json
import random
import re
import sys
from typing import Any

SEED = 18
CASES = 120

BASE: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
}

ARGS: dict[str, Any] = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "max_grad_norm": 1.0,
    "learning_rate": 5e-5,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "fp16": False,
    "bf16": False,
    "fp16_full_eval": False,
    "bf16_full_eval": False,
    "save_on_each_node": False,
    "warmup_steps": 3,
}

# key in the config -> (argument it follows, a value that disagrees)
FIXED: dict[str, tuple[str, Any]] = {
    "train_micro_batch_size_per_gpu": ("per_device_train_batch_size", 8),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", 4),
    "train_batch_size": ("", 64),
    "gradient_clipping": ("max_grad_norm", 0.5),
    "fp16.enabled": ("fp16", True),
    "bf16.enabled": ("bf16", True),
    "optimizer.params.lr": ("learning_rate", 1e-3),
    "optimizer.params.betas": ("", [0.8, 0.95]),
    "optimizer.params.eps": ("adam_epsilon", 1e-6),
    "optimizer.params.weight_decay": ("weight_decay", 0.1),
    "scheduler.params.warmup_max_lr": ("learning_rate", 1e-2),
    "scheduler.params.warmup_num_steps": ("", 7),
    "scheduler.params.total_num_steps": ("", 1000),
}


def _set(cfg: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = cfg
    for part in parents:
        node = node[part]
    node[leaf] = value


def _drop(cfg: dict[str, Any], key: str) -> None:
    *parents, leaf = key.split(".")
    node = cfg
    for part in parents:
        node = node[part]
    node.pop(leaf, None)


class Args:
    """The TrainingArguments attributes the two passes read."""

    def __init__(self, world_size: int, **kw: Any) -> None:
        self.world_size = world_size
        self.__dict__.update(kw)

    def get_warmup_steps(self, num_training_steps: int) -> int:
        return int(self.warmup_steps)


class Model:
    def __init__(self, hidden: int) -> None:
        self.config = type("C", (), {"hidden_size": hidden})()


def make_cases() -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    cases = []
    for i in range(CASES):
        cfg = copy.deepcopy(BASE)
        args = dict(ARGS)
        changes = []
        for key in rng.sample(sorted(FIXED), rng.randint(1, 4)):
            arg, other = FIXED[key]
            choice = rng.choice(["agree", "disagree", "drop"])
            if (
                choice == "drop"
                and not key.startswith("train")
                and key != "gradient_accumulation_steps"
            ):
                _drop(cfg, key)
            elif choice == "disagree":
                _set(cfg, key, other)
            else:  # the value the arguments give: fixed in the config, agreeing
                value = {
                    "train_batch_size": 4 * 2 * 2,
                    "optimizer.params.betas": [0.9, 0.999],
                    "scheduler.params.warmup_num_steps": 3,
                    "scheduler.params.total_num_steps": 100,
                }.get(key, args.get(arg))
                _set(cfg, key, value)
            changes.append(f"{choice} {key}")
        if rng.random() < 0.3:
            args["bf16"] = True
        if rng.random() < 0.2:
            cfg["zero_optimization"]["stage"] = 2
        cases.append(
            {
                "name": f"fill/{i}",
                "changes": changes,
                "config": cfg,
                "args": args,
                "world_size": 2,
                "num_training_steps": 100,
                "hidden_size": 16,
            }
        )
    return cases


def verdict(case: dict[str, Any]) -> dict[str, Any]:
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(case["config"]))
    args = Args(case["world_size"], **case["args"])
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, Model(case["hidden_size"]), case["num_training_steps"])
    except ValueError as exc:
        keys = sorted(set(re.findall(r"- ds ([\w.]+)=", str(exc))))
        return {"transformers": "mismatch", "keys": keys}
    return {"transformers": "filled", "filled": hf.config}


def main() -> None:
    cases = make_cases()
    for case in cases:
        case.update(verdict(case))
    json.dump(
        {"generator": "tools/hf_fill_verdicts.py", "seed": SEED, "cases": cases},
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
