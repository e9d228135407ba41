"""Lion step on GPUs with Triton (on CPU through ``TRITON_INTERPRET=1``).

Same definition as :mod:`ds.ops.triton.lion_reference`; one launch over the flat buffer.
"""

from __future__ import annotations

import torch

from ds.ops.triton import _flat


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
    _flat.check("Lion", params, low_precision_out, grads=grads, exp_avg=exp_avg)
    if params.numel() == 0:
        return
    k = _flat.kernels("lion_kernels", "ds.ops.triton.lion_reference.lion_step")
    lp = low_precision_out if low_precision_out is not None else params
    _flat.launch(
        k.lion_kernel,
        params,
        params,
        grads,
        exp_avg,
        lp,
        beta1,
        beta2,
        1.0 - beta1,
        1.0 - beta2,
        lr,
        lr * weight_decay,
        HAS_LP=low_precision_out is not None,
    )
