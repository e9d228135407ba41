"""``deepspeed.moe``: mixture-of-experts layers, gates and parameter helpers, mapped to
:mod:`ds.parallel.moe`."""

from ds.full.compat.deepspeed.moe import layer, sharded_moe, utils

__all__ = ["layer", "sharded_moe", "utils"]
