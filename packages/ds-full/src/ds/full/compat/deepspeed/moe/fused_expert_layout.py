"""``deepspeed.moe.fused_expert_layout``: :mod:`ds.parallel.moe.fused_layout`."""

from ds.parallel.moe.fused_layout import FusedExpertLayout, classify_fused_gate_up_layout

__all__ = ["FusedExpertLayout", "classify_fused_gate_up_layout"]
