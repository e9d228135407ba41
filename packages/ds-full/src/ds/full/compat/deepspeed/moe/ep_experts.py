"""``deepspeed.moe.ep_experts``: all experts' gated MLPs stacked in one module
(:mod:`ds.parallel.moe.token_choice`)."""

from __future__ import annotations

from ds.parallel.moe.autoep_config import EXPERT_ACTIVATIONS
from ds.parallel.moe.token_choice import GroupedExperts

__all__ = ["EXPERT_ACTIVATIONS", "GroupedExperts"]
