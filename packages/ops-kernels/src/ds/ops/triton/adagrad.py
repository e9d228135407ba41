"""Adagrad step on GPUs with Triton (on CPU through ``TRITON_INTERPRET=1``).

Same definition as :func:`ds.ops.reference.adagrad_step`; one launch over the flat buffer.
"""

from __future__ import annotations

from typing import Any

from ds.ops import reference
from ds.ops.triton import _flat


@_flat.step_like(reference.adagrad_step)
def adagrad_step(a: Any) -> None:
    """One Adagrad step on flat tensors, in place."""
    params, lp = a.params, a.low_precision_out
    _flat.check("Adagrad", params, lp, grads=a.grads, state_sum=a.state_sum)
    if params.numel() == 0:
        return
    k = _flat.kernels("adagrad_kernels", "ds.ops.reference.adagrad_step")
    _flat.launch(
        k.adagrad_kernel,
        params,
        params,
        a.grads,
        a.state_sum,
        lp if lp is not None else params,
        a.lr,
        a.eps,
        a.weight_decay,
        HAS_LP=lp is not None,
    )
