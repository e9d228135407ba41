"""``deepspeed.moe``: mixture-of-experts layers, which ds does not have yet. The helpers that
only sort parameters work (a script that never builds an MoE layer runs)."""

from ds.full.compat.deepspeed.moe import layer, utils

__all__ = ["layer", "utils"]
