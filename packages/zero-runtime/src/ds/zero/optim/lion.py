"""Lion (sign of an interpolated momentum), the one config optimizer torch does not ship."""

from __future__ import annotations

from typing import Any

import torch

from ds.zero.optim.base import FlatOptimizer, next_step


class Lion(FlatOptimizer):
    def __init__(
        self,
        params: Any,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    def _update(
        self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]
    ) -> None:
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p)
        next_step(state)
        beta1, beta2 = group["betas"]
        exp_avg = state["exp_avg"]
        p.mul_(1.0 - group["lr"] * group["weight_decay"])
        update = exp_avg.mul(beta1).add_(grad, alpha=1.0 - beta1).sign_()
        p.add_(update, alpha=-group["lr"])
        exp_avg.mul_(beta2).add_(grad, alpha=1.0 - beta2)
