"""Mixture-of-experts with expert parallelism (DeepSpeed's ``deepspeed.moe``) and AutoEP."""

from ds.parallel.moe.gate import TopKGate, capacity, top1gating, top2gating
from ds.parallel.moe.groups import ExpertGroups, expert_groups, expert_layout
from ds.parallel.moe.layer import Experts, MoE, MOELayer, moe_layers
from ds.parallel.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

__all__ = [
    "ExpertGroups",
    "Experts",
    "MOELayer",
    "MoE",
    "TopKGate",
    "capacity",
    "expert_groups",
    "expert_layout",
    "is_moe_param",
    "moe_layers",
    "split_params_into_different_moe_groups_for_optimizer",
    "top1gating",
    "top2gating",
]
