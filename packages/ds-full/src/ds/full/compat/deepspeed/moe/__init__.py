"""``deepspeed.moe``: mixture-of-experts layers and their parameter helpers, mapped to
:mod:`ds.parallel.moe`."""

from ds.full.compat.deepspeed.moe import layer, utils

__all__ = ["layer", "utils"]
