"""``deepspeed.moe.sharded_moe``: the gate and the layer of ds's mixture of experts
(:mod:`ds.parallel.moe`): ``TopKGate``, ``MOELayer``, ``top1gating``, ``top2gating``,
``gumbel_rsample``, ``multiplicative_jitter``."""

from ds.full.compat.deepspeed._missing import missing_function
from ds.parallel.moe.gate import (
    TopKGate,
    gumbel_rsample,
    multiplicative_jitter,
    top1gating,
    top2gating,
)
from ds.parallel.moe.layer import MOELayer

topkgating = missing_function(
    "deepspeed.moe.sharded_moe.topkgating",
    "top-k gating for k > 2",
    "use k=1 or k=2 (top1gating / top2gating, TopKGate(k=...))",
)

__all__ = [
    "MOELayer",
    "TopKGate",
    "gumbel_rsample",
    "multiplicative_jitter",
    "top1gating",
    "top2gating",
    "topkgating",
]
