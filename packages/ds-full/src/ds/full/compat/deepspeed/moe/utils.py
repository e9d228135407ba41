"""``deepspeed.moe.utils``: ds's :mod:`ds.parallel.moe.utils` (DeepSpeed's semantics)."""

from ds.parallel.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

__all__ = ["is_moe_param", "split_params_into_different_moe_groups_for_optimizer"]
