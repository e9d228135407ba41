"""Lion step on GPUs with Triton (on CPU through ``TRITON_INTERPRET=1``).

Same definition as :func:`ds.ops.reference.lion_step`; one launch over the flat buffer.
"""

from __future__ import annotations

from typing import Any

from ds.ops import reference
from ds.ops.triton import _flat


@_flat.step_like(reference.lion_step)
def lion_step(a: Any) -> None:
    """One Lion step on flat tensors, in place."""
    params, lp = a.params, a.low_precision_out
    _flat.check("Lion", params, lp, grads=a.grads, exp_avg=a.exp_avg)
    if params.numel() == 0:
        return
    k = _flat.kernels("lion_kernels", "ds.ops.reference.lion_step")
    _flat.launch(
        k.lion_kernel,
        params,
        params,
        a.grads,
        a.exp_avg,
        lp if lp is not None else params,
        a.beta1,
        a.beta2,
        1.0 - a.beta1,
        1.0 - a.beta2,
        a.lr,
        a.lr * a.weight_decay,
        HAS_LP=lp is not None,
    )
