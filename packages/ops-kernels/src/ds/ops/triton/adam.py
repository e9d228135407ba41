"""Fused Adam/AdamW step on GPUs with Triton (on CPU through ``TRITON_INTERPRET=1``).

One pass over each buffer: params fp32, bf16 or fp16; grads any of those; moments fp32 or the
param dtype; optionally a bf16/fp16 copy of fp32 params. Same definition as
:mod:`ds.ops.triton.adam_reference`.
"""

from __future__ import annotations

import torch

from ds.interfaces.errors import KernelError
from ds.ops.triton import _flat


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
    _flat.check(
        "Adam", params, low_precision_out, grads=grads, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq
    )
    if exp_avg.dtype != exp_avg_sq.dtype:
        raise KernelError("exp_avg and exp_avg_sq must share a dtype")
    if step < 1:
        raise KernelError("step must be >= 1 (the count of this update, starting at 1)")
    if params.numel() == 0:
        return
    # Coefficients in double on the host, as the CPU kernels do.
    bc1 = 1.0 - beta1**step if bias_correction else 1.0
    bc2 = 1.0 - beta2**step if bias_correction else 1.0
    k = _flat.kernels("adam_kernels", "ds.ops.triton.adam_reference.adam_step")
    lp = low_precision_out if low_precision_out is not None else params
    _flat.launch(
        k.adam_kernel,
        params,
        params,
        grads,
        exp_avg,
        exp_avg_sq,
        lp,
        beta1,
        beta2,
        1.0 - beta1,
        1.0 - beta2,
        eps,
        weight_decay,
        1.0 - lr * weight_decay,
        lr / bc1,
        1.0 / bc2**0.5,
        ADAMW=bool(adamw_mode),
        HAS_LP=low_precision_out is not None,
    )
