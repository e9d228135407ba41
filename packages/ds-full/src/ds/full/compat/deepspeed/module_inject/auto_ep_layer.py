"""``deepspeed.module_inject.auto_ep_layer``: the AutoEP MoE layer (dropless token-choice router,
grouped experts, all-to-all over the expert-parallel group) and its routing helpers
(:mod:`ds.parallel.moe.autoep_layer`, :mod:`ds.parallel.moe.routes`). DeepSpeed's split planner
(its own all-to-all size exchange) is not provided: ds's layer exchanges sizes itself."""

from __future__ import annotations

from typing import Any

from ds.full.compat.deepspeed._missing import missing_class, missing_function
from ds.parallel.moe.autoep_layer import AutoEPMoELayer
from ds.parallel.moe.routes import combine_from_routed
from ds.parallel.moe.token_choice import (
    apply_scores_before_experts as apply_scores_before_experts_if_enabled,
)

_PLANNER = "DeepSpeed's AutoEP split planner"
_HINT = "AutoEPMoELayer exchanges its all-to-all sizes itself"
SplitPlan = missing_class("deepspeed.module_inject.auto_ep_layer.SplitPlan", _PLANNER, _HINT)
compute_split_plan = missing_function(
    "deepspeed.module_inject.auto_ep_layer.compute_split_plan", _PLANNER, _HINT
)
compute_split_plan_from_expert_indices = missing_function(
    "deepspeed.module_inject.auto_ep_layer.compute_split_plan_from_expert_indices", _PLANNER, _HINT
)


def resolve_score_apply_mode(spec: Any, config_override: str) -> str:
    """The config's ``score_apply`` unless "auto", else the detected layer's."""
    return config_override if config_override != "auto" else str(spec.score_apply)


__all__ = [
    "AutoEPMoELayer",
    "SplitPlan",
    "apply_scores_before_experts_if_enabled",
    "combine_from_routed",
    "compute_split_plan",
    "compute_split_plan_from_expert_indices",
    "resolve_score_apply_mode",
]
