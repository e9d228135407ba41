"""``deepspeed.ops.lion``: ``DeepSpeedCPULion`` (ds.ops CPULion, SIMD CPU kernels) and
``FusedLion``, the Lion optimizer on any device (ds's Triton Lion kernel on CUDA, its pure-torch
definition elsewhere)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def _step_fn(device: torch.device) -> Callable[..., None]:
    if device.type == "cuda":
        try:
            from ds.ops.triton.lion import lion_step

            return lion_step
        except ImportError:
            pass
    from ds.ops.reference import lion_step

    return lion_step


class FusedLion(torch.optim.Optimizer):
    """DeepSpeed's ``FusedLion(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0,
    set_grad_none=True)``: ``p -= lr * (sign(b1 m + (1 - b1) g) + wd p)``, then
    ``m = b2 m + (1 - b2) g``."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        set_grad_none: bool = True,
    ) -> None:
        if lr < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(
                f"FusedLion(lr={lr}, betas={betas}, weight_decay={weight_decay}): lr and "
                "weight_decay must be >= 0 and each beta in [0, 1)"
            )
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})
        self.set_grad_none = set_grad_none

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FusedLion does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["step"] = 0
                state["step"] += 1
                flat = p.data if p.data.is_contiguous() else p.data.contiguous()
                _step_fn(p.device)(
                    flat.view(-1), p.grad.contiguous().view(-1), state["exp_avg"].view(-1),
                    lr=group["lr"], beta1=beta1, beta2=beta2,
                    weight_decay=group["weight_decay"],
                )  # fmt: skip
                if flat is not p.data:
                    p.data.copy_(flat)
        return loss


def __getattr__(name: str) -> Any:
    if name in ("DeepSpeedCPULion", "CPULion"):
        from ds.ops.optim.lion import CPULion

        return CPULion
    raise AttributeError(f"deepspeed.ops.lion.{name} has no ds equivalent")


__all__ = ["FusedLion"]  # DeepSpeedCPULion resolves lazily
