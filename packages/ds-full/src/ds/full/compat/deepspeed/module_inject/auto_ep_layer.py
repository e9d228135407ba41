"""``deepspeed.module_inject.auto_ep_layer``: routed-output combination and score application
(:mod:`ds.parallel.moe`). DeepSpeed's ``AutoEPMoELayer`` and its split planner are not provided:
ds's AutoEP replaces a model's experts with ``ds.parallel.moe.autoep.ExpertParallelExperts``
(``expert_parallel.autoep_size``)."""

from __future__ import annotations

from typing import Any

from ds.full.compat.deepspeed._missing import missing_class, missing_function
from ds.parallel.moe.routes import combine_from_routed
from ds.parallel.moe.token_choice import (
    apply_scores_before_experts as apply_scores_before_experts_if_enabled,
)

_HINT = "enable expert_parallel.autoep_size: ds's AutoEP replaces the model's experts itself"
AutoEPMoELayer = missing_class(
    "deepspeed.module_inject.auto_ep_layer.AutoEPMoELayer", "DeepSpeed's AutoEP MoE layer", _HINT
)
SplitPlan = missing_class(
    "deepspeed.module_inject.auto_ep_layer.SplitPlan", "DeepSpeed's AutoEP split planner", _HINT
)
compute_split_plan = missing_function(
    "deepspeed.module_inject.auto_ep_layer.compute_split_plan",
    "DeepSpeed's AutoEP split planner",
    _HINT,
)
compute_split_plan_from_expert_indices = missing_function(
    "deepspeed.module_inject.auto_ep_layer.compute_split_plan_from_expert_indices",
    "DeepSpeed's AutoEP split planner",
    _HINT,
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
