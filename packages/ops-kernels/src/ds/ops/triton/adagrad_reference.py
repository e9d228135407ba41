"""Pure-torch Adagrad step (no lr decay): the definition the Triton kernel implements.

``g += wd p`` (L2); ``s += g * g``; ``p -= lr g / (sqrt(s) + eps)``, as torch.optim.Adagrad.
Works on any device; math in fp32, each buffer rounded to its dtype once at the end.
"""

from __future__ import annotations

import torch


def adagrad_step(
    params: torch.Tensor,
    grads: torch.Tensor,
    state_sum: torch.Tensor,
    *,
    lr: float,
    eps: float = 1e-10,
    weight_decay: float = 0.0,
    low_precision_out: torch.Tensor | None = None,
) -> None:
    """One step on flat tensors, in place."""
    p = params.float()
    g = grads.float()
    if weight_decay:
        g = g + weight_decay * p
    s = state_sum.float() + g * g
    p = p - lr * (g / (s.sqrt() + eps))
    params.copy_(p)
    state_sum.copy_(s)
    if low_precision_out is not None:
        low_precision_out.copy_(p)
