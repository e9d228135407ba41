"""ds's LR schedules give DeepSpeed 0.19.8's learning rates at every step (recorded by
``tools/deepspeed_schedules.py``), so a config ``scheduler`` section trains the same under both."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from ds.zero import lr_schedules

FIXTURE = Path(__file__).parent / "fixtures" / "deepspeed_schedules.json"
CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['type']}-{sorted(c['params'])}")
def test_schedule_matches_deepspeed_step_by_step(case: dict[str, Any]) -> None:
    params = {k: v for k, v in case["params"].items() if k != "adamw"}
    p = [torch.nn.Parameter(torch.zeros(1))]
    opt = (
        torch.optim.AdamW(p, lr=0.01)
        if case["params"].get("adamw")
        else torch.optim.SGD(p, lr=0.01, momentum=0.9)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # total_num_steps below the warm-up: DeepSpeed warns too
        sched = getattr(lr_schedules, case["type"])(opt, **params)

    def mom() -> float:
        g = opt.param_groups[0]
        return float(g["betas"][0] if "betas" in g else g["momentum"])

    lrs, moms = [opt.param_groups[0]["lr"]], [mom()]
    for _ in range(len(case["lrs"]) - 1):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
        moms.append(mom())
    assert lrs == pytest.approx(case["lrs"], rel=1e-9, abs=1e-15)
    assert moms == pytest.approx(case["moms"], rel=1e-9)
    assert sched.state_dict()["last_batch_iteration"] == case["state"]["last_batch_iteration"]
