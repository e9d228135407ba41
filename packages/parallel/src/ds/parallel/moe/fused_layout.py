"""Which way round a model stores its fused expert weights, read from the tensor shapes.

transformers' fused experts hold ``gate_up_proj`` (gate and up projections stacked) and
``down_proj`` for all ``E`` experts in one tensor each. Most models store them as linear weights,
``[E, 2I, H]`` and ``[E, H, I]`` ("gate_up_first"); some store the transpose, ``[E, H, 2I]`` and
``[E, I, H]`` ("hidden_first"), which must be transposed before use as ``F.linear`` weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class FusedExpertLayout:
    layout: Literal["gate_up_first", "hidden_first"]
    hidden_size: int  # H
    ffn_hidden_size: int  # I, each expert's intermediate width
    needs_transpose: bool


def classify_fused_gate_up_layout(
    w1_shape: Sequence[int], w2_shape: Sequence[int]
) -> FusedExpertLayout | None:
    """The layout of ``gate_up_proj`` (``w1_shape``) and ``down_proj`` (``w2_shape``), or None
    when the shapes fit neither (not 3-D, an odd fused width, or sizes that disagree)."""
    w1, w2 = tuple(w1_shape), tuple(w2_shape)
    if len(w1) != 3 or len(w2) != 3:
        return None
    _, a, b = w1
    if a % 2 == 0 and w2[1:] == (b, a // 2):
        return FusedExpertLayout("gate_up_first", b, a // 2, needs_transpose=False)
    if b % 2 == 0 and w2[1:] == (b // 2, a):
        return FusedExpertLayout("hidden_first", a, b // 2, needs_transpose=True)
    return None


__all__ = ["FusedExpertLayout", "classify_fused_gate_up_layout"]
