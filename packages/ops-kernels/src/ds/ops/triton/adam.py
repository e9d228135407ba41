"""Fused Adam/AdamW step on GPUs with Triton (on CPU through ``TRITON_INTERPRET=1``).

One pass over each buffer: params fp32, bf16 or fp16; grads any of those; moments fp32 or the
param dtype; optionally a bf16/fp16 copy of fp32 params. Same definition as
:func:`ds.ops.reference.adam_step`.
"""

from __future__ import annotations

from typing import Any

from ds.interfaces.errors import KernelError
from ds.ops import reference
from ds.ops.triton import _flat


@_flat.step_like(reference.adam_step)
def adam_step(a: Any) -> None:
    """One AdamW (``adamw_mode=False``: Adam with L2 decay) step on flat tensors, in place."""
    params, lp = a.params, a.low_precision_out
    _flat.check("Adam", params, lp, grads=a.grads, exp_avg=a.exp_avg, exp_avg_sq=a.exp_avg_sq)
    if a.exp_avg.dtype != a.exp_avg_sq.dtype:
        raise KernelError("exp_avg and exp_avg_sq must share a dtype")
    if a.step < 1:
        raise KernelError("step must be >= 1 (the count of this update, starting at 1)")
    if params.numel() == 0:
        return
    # Coefficients in double on the host, as the CPU kernels do.
    bc1 = 1.0 - a.beta1**a.step if a.bias_correction else 1.0
    bc2 = 1.0 - a.beta2**a.step if a.bias_correction else 1.0
    k = _flat.kernels("adam_kernels", "ds.ops.reference.adam_step")
    _flat.launch(
        k.adam_kernel,
        params,
        params,
        a.grads,
        a.exp_avg,
        a.exp_avg_sq,
        lp if lp is not None else params,
        a.beta1,
        a.beta2,
        1.0 - a.beta1,
        1.0 - a.beta2,
        a.eps,
        a.weight_decay,
        1.0 - a.lr * a.weight_decay,
        a.lr / bc1,
        1.0 / bc2**0.5,
        ADAMW=bool(a.adamw_mode),
        HAS_LP=lp is not None,
    )
