"""Tensor parallelism for transformers models: AutoTP (plan selection and parallel layers)."""

from ._collectives import TPGroup
from .autotp import AutoTPResult, autotp, check_heads, tp_group_of
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .plan import Placement, plan_for
from .state import gather_full_state_dict, gather_tensor, unshard

__all__ = [
    "AutoTPResult",
    "ColumnParallelLinear",
    "Placement",
    "RowParallelLinear",
    "TPGroup",
    "VocabParallelEmbedding",
    "autotp",
    "check_heads",
    "gather_full_state_dict",
    "gather_tensor",
    "plan_for",
    "tp_group_of",
    "unshard",
]
