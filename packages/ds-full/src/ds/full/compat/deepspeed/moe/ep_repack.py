"""``deepspeed.moe.ep_repack``: repacking a model's expert weights for DeepSpeed's AutoEP layer.

ds's AutoEP (``expert_parallel.autoep_size``) keeps each rank's experts from the model's fused
tensors itself (:class:`ds.parallel.moe.autoep.ExpertParallelExperts`); DeepSpeed's repacking
into its own layer is not provided."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_function
from ds.full.compat.deepspeed.zero import GatheredParameters

repack_expert_weights = missing_function(
    "deepspeed.moe.ep_repack.repack_expert_weights",
    "DeepSpeed's AutoEP expert repacking",
    "enable expert_parallel.autoep_size: ds's AutoEP takes each rank's experts from the model",
)

__all__ = ["GatheredParameters", "repack_expert_weights"]
