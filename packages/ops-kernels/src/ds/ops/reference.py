"""The pure-torch reference of each optimizer step on flat buffers: the definition that the
Triton kernels (:mod:`ds.ops.triton`) and the native CPU kernels (:mod:`ds.ops.cpu_optim`)
implement, and the steps of the ``torch`` kernel provider (:mod:`ds.ops.torch_provider`).

Works on any device (and on tensors without data, which it only traces). Math in fp32 whatever
the storage dtype; params and states are rounded to their own dtypes once at the end of the step,
exactly as the kernels store them; ``low_precision_out`` receives a bf16/fp16 copy of the new
fp32 params.

- Adam/AdamW: ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g g``; AdamW first scales
  ``p *= 1 - lr wd`` (Adam adds ``wd p`` to ``g``); ``p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) +
  eps)``, with the bias corrections ``bc = 1 - b^step`` (1 without bias correction).
- Adagrad (no lr decay): ``g += wd p`` (L2); ``s += g g``; ``p -= lr g / (sqrt(s) + eps)``, as
  torch.optim.Adagrad.
- Lion: ``c = b1 m + (1 - b1) g``; ``p -= lr sign(c) + lr wd p``; ``m = b2 m + (1 - b2) g``.
"""

from __future__ import annotations

import torch

__all__ = ["adagrad_step", "adam_step", "lion_step"]


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
    """One AdamW (``adamw_mode=False``: Adam with L2 decay) step on flat tensors, in place."""
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
    _store(p, params, low_precision_out, (m, exp_avg), (v, exp_avg_sq))


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
    """One Adagrad step on flat tensors, in place."""
    p = params.float()
    g = grads.float()
    if weight_decay:
        g = g + weight_decay * p
    s = state_sum.float() + g * g
    p = p - lr * (g / (s.sqrt() + eps))
    _store(p, params, low_precision_out, (s, state_sum))


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
    """One Lion step on flat tensors, in place."""
    p = params.float()
    g = grads.float()
    m = exp_avg.float()
    direction = torch.sign(m * beta1 + g * (1.0 - beta1))
    p = p - (lr * direction + (lr * weight_decay) * p)
    m = m * beta2 + g * (1.0 - beta2)
    _store(p, params, low_precision_out, (m, exp_avg))


def _store(
    p: torch.Tensor,
    params: torch.Tensor,
    low_precision_out: torch.Tensor | None,
    *states: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Round the fp32 results into the buffers (each to its own dtype, once)."""
    params.copy_(p)
    for value, buffer in states:
        buffer.copy_(value)
    if low_precision_out is not None:
        low_precision_out.copy_(p)
