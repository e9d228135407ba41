"""Record the learning rates DeepSpeed 0.19.8's schedules give, step by step.

    DS_ACCELERATOR=cpu /path/to/deepspeed-env/bin/python tools/deepspeed_schedules.py \
        > packages/zero-runtime/tests/fixtures/deepspeed_schedules.json

Each case builds one ``deepspeed.runtime.lr_schedules`` class on a one-parameter SGD optimizer
(lr 0.01, momentum 0.9; AdamW where ``"adamw"`` is set) and records the optimizer's LR and
momentum after construction and after each of 30 ``step()`` calls, and the ``state_dict()`` at the end. ``test_schedules_deepspeed_parity.py``
builds ds's schedule of the same name and params and compares.
"""

from __future__ import annotations

import json
import sys
from typing import Any

STEPS = 30

CASES: list[tuple[str, dict[str, Any]]] = [
    ("WarmupLR", {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 4}),
    (
        "WarmupLR",
        {
            "warmup_min_lr": 0.0,
            "warmup_max_lr": 0.02,
            "warmup_num_steps": 10,
            "warmup_type": "linear",
        },
    ),
    ("WarmupLR", {"warmup_num_steps": 1}),
    ("WarmupDecayLR", {"total_num_steps": 20, "warmup_max_lr": 0.01, "warmup_num_steps": 5}),
    (
        "WarmupDecayLR",
        {
            "total_num_steps": 12,
            "warmup_min_lr": 0.001,
            "warmup_max_lr": 0.01,
            "warmup_num_steps": 3,
            "warmup_type": "linear",
        },
    ),
    ("WarmupDecayLR", {"total_num_steps": 3, "warmup_num_steps": 6}),
    (
        "WarmupCosineLR",
        {
            "total_num_steps": 25,
            "warmup_min_ratio": 0.1,
            "warmup_num_steps": 5,
            "cos_min_ratio": 0.01,
        },
    ),
    ("WarmupCosineLR", {"total_num_steps": 10, "warmup_num_steps": 2, "warmup_type": "linear"}),
    (
        "OneCycle",
        {
            "cycle_min_lr": 0.001,
            "cycle_max_lr": 0.01,
            "cycle_first_step_size": 5,
            "cycle_momentum": False,
        },
    ),
    (
        "OneCycle",
        {
            "cycle_min_lr": 0.001,
            "cycle_max_lr": 0.01,
            "cycle_first_step_size": 4,
            "cycle_second_step_size": 6,
            "decay_lr_rate": 0.1,
            "decay_step_size": 3,
            "cycle_momentum": False,
        },
    ),
    (
        "OneCycle",
        {
            "cycle_min_lr": 0.001,
            "cycle_max_lr": 0.01,
            "cycle_first_step_size": 4,
            "cycle_first_stair_count": 2,
            "cycle_momentum": False,
        },
    ),
    (
        "OneCycle",
        {
            "cycle_min_lr": 0.001,
            "cycle_max_lr": 0.01,
            "cycle_first_step_size": 4,
            "decay_step_size": 2,
            "decay_mom_rate": 0.01,
            "cycle_min_mom": 0.85,
            "cycle_max_mom": 0.95,
            "adamw": True,
        },
    ),
    ("OneCycle", {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 4}),
    (
        "LRRangeTest",
        {
            "lr_range_test_min_lr": 0.001,
            "lr_range_test_step_size": 3,
            "lr_range_test_step_rate": 2.0,
        },
    ),
    (
        "LRRangeTest",
        {
            "lr_range_test_min_lr": 0.001,
            "lr_range_test_step_size": 3,
            "lr_range_test_step_rate": 2.0,
            "lr_range_test_staircase": True,
        },
    ),
]


def main() -> None:
    import logging

    import torch
    from deepspeed.runtime import lr_schedules

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    out = []
    for name, params in CASES:
        kw = {k: v for k, v in params.items() if k != "adamw"}
        p = [torch.nn.Parameter(torch.zeros(1))]
        opt = (
            torch.optim.AdamW(p, lr=0.01)
            if params.get("adamw")
            else torch.optim.SGD(p, lr=0.01, momentum=0.9)
        )
        sched = getattr(lr_schedules, name)(opt, **kw)

        def mom(opt: Any = opt) -> float:
            g = opt.param_groups[0]
            return float(g["betas"][0] if "betas" in g else g["momentum"])

        lrs, moms = [float(opt.param_groups[0]["lr"])], [mom()]
        for _ in range(STEPS):
            sched.step()
            lrs.append(float(opt.param_groups[0]["lr"]))
            moms.append(mom())
        state = {k: v for k, v in sched.state_dict().items() if isinstance(v, int | float)}
        out.append({"type": name, "params": params, "lrs": lrs, "moms": moms, "state": state})
    json.dump({"generator": "tools/deepspeed_schedules.py", "cases": out}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
