"""Fused Adam/AdamW step on GPUs with Triton (on CPU through ``TRITON_INTERPRET=1``).

One pass over each buffer: params fp32, bf16 or fp16; grads any of those; moments fp32 or the
param dtype. Same definition as :mod:`ds.ops.triton.adam_reference`.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ds.interfaces.errors import KernelError

_BLOCK = 1024
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _kernels() -> Any:
    try:
        from ds.ops.triton import adam_kernels
    except ImportError as e:
        raise KernelError(
            "the Triton Adam step needs the 'triton' package (pip install triton); "
            "ds.ops.triton.adam_reference.adam_step is the pure-torch equivalent"
        ) from e
    return adam_kernels


def _check(params: torch.Tensor, **others: torch.Tensor) -> None:
    if params.dtype not in _DTYPES:
        raise KernelError(f"params has dtype {params.dtype}; use float32, bfloat16 or float16")
    for name, t in others.items():
        if t.numel() != params.numel():
            raise KernelError(f"{name} has {t.numel()} elements but params has {params.numel()}")
        if t.device != params.device:
            raise KernelError(f"{name} is on {t.device} but params is on {params.device}")
        if t.dtype not in _DTYPES:
            raise KernelError(f"{name} has dtype {t.dtype}; use float32, bfloat16 or float16")
    for name, t in {"params": params, **others}.items():
        if not t.is_contiguous():
            raise KernelError(f"{name} is not contiguous; call .contiguous() on it first")
        if t.requires_grad:
            raise KernelError(f"{name} requires grad; pass t.detach()")
    if others["exp_avg"].dtype != others["exp_avg_sq"].dtype:
        raise KernelError("exp_avg and exp_avg_sq must share a dtype")
    if params.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise KernelError(
            "the Triton Adam step runs on GPU tensors; on CPU use ds.ops.cpu_optim.adam_step "
            "(or set TRITON_INTERPRET=1 to interpret the kernel)"
        )


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
) -> None:
    """One AdamW (``adamw_mode=False``: Adam with L2 decay) step on flat tensors, in place."""
    _check(params, grads=grads, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    if step < 1:
        raise KernelError("step must be >= 1 (the count of this update, starting at 1)")
    n = params.numel()
    if n == 0:
        return
    # Coefficients in double on the host, as the CPU kernels do.
    bc1 = 1.0 - beta1**step if bias_correction else 1.0
    bc2 = 1.0 - beta2**step if bias_correction else 1.0
    k = _kernels()
    grid = ((n + _BLOCK - 1) // _BLOCK,)
    k.adam_kernel[grid](
        params,
        grads,
        exp_avg,
        exp_avg_sq,
        n,
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
        BLOCK=_BLOCK,
    )
