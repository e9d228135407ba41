"""Pure-torch fused Adam/AdamW step: the definition the Triton kernel implements.

Works on any device. Math in fp32 whatever the storage dtype; params and moments are rounded to
their own dtypes once at the end of the step, exactly as the kernel stores them.
"""

from __future__ import annotations

import torch


def adam_step(
    params: torch.Tensor,
    grads: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    adamw_mode: bool = True,
    bias_correction: bool = True,
    low_precision_out: torch.Tensor | None = None,
) -> None:
    """One step on flat tensors, in place (``low_precision_out``: a bf16/fp16 copy of the new
    fp32 params)."""
    p = params.float()
    g = grads.float()
    if not adamw_mode and weight_decay:
        g = g + weight_decay * p
    m = exp_avg.float() * beta1 + g * (1.0 - beta1)
    v = exp_avg_sq.float() * beta2 + g * g * (1.0 - beta2)
    bc1 = 1.0 - beta1**step if bias_correction else 1.0
    bc2 = 1.0 - beta2**step if bias_correction else 1.0
    if adamw_mode and weight_decay:
        p = p * (1.0 - lr * weight_decay)
    p = p - (lr / bc1) * m / (v.sqrt() * (1.0 / bc2**0.5) + eps)
    params.copy_(p)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    if low_precision_out is not None:
        low_precision_out.copy_(p)
