"""``deepspeed.moe.utils``: parameter sorting helpers. Without MoE layers no parameter is an
expert parameter, so these return their input's groups unchanged, as DeepSpeed's do for a
dense model."""

from __future__ import annotations

from typing import Any

import torch


def is_moe_param(param: torch.Tensor) -> bool:
    return bool(getattr(param, "allreduce", True) is False)


def split_params_into_different_moe_groups_for_optimizer(
    param_groups: Any, max_group_size: int | None = 178956971
) -> list[dict[str, Any]]:
    """DeepSpeed splits expert parameters into their own groups; a dense model has none, so the
    groups come back as given (a single dict becomes a one-element list)."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")
    for group in param_groups:
        if any(is_moe_param(p) for p in group["params"]):
            from ds.full.compat.deepspeed._missing import FeatureNotAvailableError

            raise FeatureNotAvailableError(
                "deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer: the "
                "model has expert parameters, and mixture-of-experts is not available in ds"
            )
    return list(param_groups)


__all__ = ["is_moe_param", "split_params_into_different_moe_groups_for_optimizer"]
