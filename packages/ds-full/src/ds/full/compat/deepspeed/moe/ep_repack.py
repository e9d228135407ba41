"""``deepspeed.moe.ep_repack``: this rank's experts of a MoE block, stacked for
``GroupedExperts`` (:func:`ds.parallel.moe.autoep_layer.repack_experts`). ZeRO-3 partitioned
source weights are gathered whole while they are copied (``GatheredParameters``)."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from ds.full.compat.deepspeed.zero import GatheredParameters
from ds.parallel.moe.autoep_config import MoELayerSpec
from ds.parallel.moe.autoep_layer import repack_experts


def gather(params: list[nn.Parameter]) -> Any:
    # Looked up on this module at call time, so a replaced GatheredParameters is honoured.
    return sys.modules[__name__].GatheredParameters(params, modifier_rank=None)


def repack_expert_weights(
    experts_module: nn.Module, spec: MoELayerSpec, ep_rank: int, ep_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return repack_experts(experts_module, spec, ep_rank, ep_size, gather)


__all__ = ["GatheredParameters", "gather", "repack_expert_weights"]
