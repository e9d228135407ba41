"""The model, data and configs of the DeepSpeed checkpoint fixtures (shared by the script that makes
them under DeepSpeed, tools/make_deepspeed_fixtures.py, and the ds tests that load them)."""

from __future__ import annotations

from typing import Any

import torch

SAVE_STEPS = 5  # trained before the checkpoint
CONTINUE_STEPS = 10  # recorded after loading it
GLOBAL_BATCH = 6  # divisible by world sizes 1, 2 and 3: every world sees the same global batch

CASES: dict[str, tuple[int, str]] = {
    f"stage{stage}_{precision}": (stage, precision)
    for stage in (0, 1, 2, 3)
    for precision in ("fp32", "bf16", "fp16")
}


# Checkpoints of a model whose first layer is frozen (requires_grad=False): DeepSpeed keeps frozen
# parameters apart (whole in the module state at stages 0-2, as fragments at stage 3); they test
# export with and without --exclude_frozen_parameters. Saved only (no continuation recorded).
FROZEN_CASES: dict[str, int] = {"frozen_stage2_fp32": 2, "frozen_stage3_fp32": 3}


class TinyNet(torch.nn.Module):
    def __init__(self, freeze_fc1: bool = False) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        self.fc1.requires_grad_(not freeze_fc1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.fc2(torch.tanh(self.fc1(x)))
        return torch.nn.functional.mse_loss(out.float(), y.float())


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one optimizer step; rank r of W takes rows [r*B/W, (r+1)*B/W)."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=g)
    y = torch.randn(GLOBAL_BATCH, 4, generator=g)
    return x, y


def config(stage: int, precision: str, micro_batch: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000,
        # DeepSpeed's default is 1.0 (written out: the fixtures must not depend on defaults)
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "Adam",
            "params": {
                "lr": 0.01,
                "betas": [0.9, 0.999],
                "eps": 1e-8,
                "weight_decay": 0.0,
                "torch_adam": True,
            },
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": 0.01,
                "warmup_num_steps": 20,
                "warmup_type": "linear",
            },
        },
        "zero_optimization": {"stage": stage},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        # Dynamic loss scaling that moves: the scale doubles every 2 clean steps (16 -> 64 at the
        # checkpoint), so a load that kept its own initial scale would continue differently.
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2,
                       "hysteresis": 2, "min_loss_scale": 1}  # fmt: skip
    return cfg
