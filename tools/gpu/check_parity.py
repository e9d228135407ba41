"""ZeRO stages 0-3, with and without CPU offload, at world 1 against torch.optim.AdamW."""

from __future__ import annotations

import copy
from typing import Any

import torch

LR, WD = 1e-3, 0.01


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 8),
    )  # fmt: skip


def config(stage: int, offload: bool, micro: int) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
        "zero_optimization": zero,
    }


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    consolidated = getattr(engine.strategy, "consolidated_state_dict", None)
    state = consolidated() if consolidated is not None else engine.module.state_dict()
    return {k: v.detach().float().cpu() for k, v in state.items()}


def run_one(stage: int, offload: bool, steps: int, device: torch.device) -> dict[str, Any]:
    import ds.full as ds

    micro = 4
    ref = _model().to(device)
    model = copy.deepcopy(ref).cpu()  # ds.initialize moves a CPU model to the rank's device
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=WD)
    engine, *_ = ds.initialize(model=model, config=config(stage, offload, micro))
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(micro, 32, generator=gen).to(device)
        y = torch.randn(micro, 8, generator=gen).to(device)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    got = _weights(engine)
    want = {k: v.detach().float().cpu() for k, v in ref.state_dict().items()}
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    on = {str(p.device) for p in engine.module.parameters()}
    return {
        "stage": stage,
        "offload": "cpu" if offload else "none",
        "max_abs_diff": diff,
        "param_devices": sorted(on),
        "ok": diff <= 1e-5,
    }


def run(stages: list[int], steps: int, device: torch.device) -> list[dict[str, Any]]:
    rows = []
    for stage in stages:
        # Optimizer offload needs ZeRO 1-3 (as in DeepSpeed).
        for offload in (False, True) if stage > 0 else (False,):
            try:
                rows.append(run_one(stage, offload, steps, device))
            except Exception as exc:  # one failing configuration must not hide the others
                rows.append(
                    {
                        "stage": stage,
                        "offload": "cpu" if offload else "none",
                        "error": f"{type(exc).__name__}: {exc}".replace("\n", " "),
                        "ok": False,
                    }
                )
    return rows
