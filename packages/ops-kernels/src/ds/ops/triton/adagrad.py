"""Adagrad step on GPUs with Triton (on CPU through ``TRITON_INTERPRET=1``).

Same definition as :mod:`ds.ops.triton.adagrad_reference`; one launch over the flat buffer.
"""

from __future__ import annotations

import torch

from ds.ops.triton import _flat


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
    _flat.check("Adagrad", params, low_precision_out, grads=grads, state_sum=state_sum)
    if params.numel() == 0:
        return
    k = _flat.kernels("adagrad_kernels", "ds.ops.triton.adagrad_reference.adagrad_step")
    lp = low_precision_out if low_precision_out is not None else params
    _flat.launch(
        k.adagrad_kernel,
        params,
        params,
        grads,
        state_sum,
        lp,
        lr,
        eps,
        weight_decay,
        HAS_LP=low_precision_out is not None,
    )
