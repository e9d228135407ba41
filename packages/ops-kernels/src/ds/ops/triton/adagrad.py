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
    _flat.run("Adagrad", a, ("state_sum",), a.lr, a.eps, a.weight_decay)
