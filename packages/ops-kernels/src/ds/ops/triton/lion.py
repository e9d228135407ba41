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
    lr, b1, b2 = a.lr, a.beta1, a.beta2
    _flat.run("Lion", a, ("exp_avg",), b1, b2, 1.0 - b1, 1.0 - b2, lr, lr * a.weight_decay)
