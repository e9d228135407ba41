"""Pure-torch Lion step: the definition the Triton kernel implements (and ds.ops.cpu_optim's).

``c = beta1 m + (1 - beta1) g``; ``p -= lr sign(c) + lr wd p``; ``m = beta2 m + (1 - beta2) g``.
Works on any device; math in fp32, each buffer rounded to its dtype once at the end.
"""

from __future__ import annotations

import torch


def lion_step(
    params: torch.Tensor,
    grads: torch.Tensor,
    exp_avg: torch.Tensor,
    *,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.99,
    weight_decay: float = 0.0,
    low_precision_out: torch.Tensor | None = None,
) -> None:
    """One step on flat tensors, in place."""
    p = params.float()
    g = grads.float()
    m = exp_avg.float()
    direction = torch.sign(m * beta1 + g * (1.0 - beta1))
    p = p - (lr * direction + (lr * weight_decay) * p)
    m = m * beta2 + g * (1.0 - beta2)
    params.copy_(p)
    exp_avg.copy_(m)
    if low_precision_out is not None:
        low_precision_out.copy_(p)
