"""``deepspeed.utils``: the logger, rank-aware logging, ZeRO-3 helpers and ``zero_to_fp32``."""

from __future__ import annotations

from typing import Any

import torch

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError, missing_function
from ds.full.compat.deepspeed.runtime.dataloader import RepeatingLoader
from ds.full.compat.deepspeed.runtime.utils import set_random_seed
from ds.full.compat.deepspeed.utils.logging import log_dist, logger, set_log_level_from_string
from ds.full.compat.deepspeed.utils.tensor_fragment import (
    safe_get_full_fp32_param,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_grad,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_optimizer_state,
    safe_set_local_fp32_param,
    safe_set_local_grad,
    safe_set_local_optimizer_state,
)
from ds.zero.stage3.leaf import (
    apply_leaf_config as apply_zero_leaf_module_config,
)
from ds.zero.stage3.leaf import (
    get_z3_leaf_modules,
    mark_by_class,
    z3_leaf_module,
    z3_leaf_parameter,
)
from ds.zero.stage3.leaf import mark_by_name as set_z3_leaf_modules_by_name
from ds.zero.stage3.leaf import mark_by_suffix as set_z3_leaf_modules_by_suffix


def set_z3_leaf_modules(
    model: torch.nn.Module, leaf_module_classes: list[Any], raise_if_not_found: bool = True
) -> list[torch.nn.Module]:
    """Mark modules of these classes (types, bare or qualified names) as ZeRO-3 leaves: stage 3
    gathers each one's whole subtree on entry (ds.zero.stage3.leaf)."""
    return mark_by_class(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(
    model: torch.nn.Module, leaf_module_classes: list[Any], raise_if_not_found: bool = True
) -> list[torch.nn.Module]:
    return mark_by_class(model, leaf_module_classes, False, raise_if_not_found)


def set_z3_leaf_module(model: torch.nn.Module, flag: bool) -> None:
    model._z3_leaf = flag  # type: ignore[assignment]


def __getattr__(name: str) -> Any:
    if name in ("zero_to_fp32", "groups", "torch"):
        # import_module, not ``from . import``: a failing import then raises instead of
        # re-entering this hook.
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"deepspeed.utils.{name} has no ds equivalent")


def safe_get_full_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """The whole gradient of ``param`` after backward, before step: on the parameter at ZeRO
    stages 0-1, gathered from the engine's reduced partitions at stages 2-3."""
    grad = param.grad
    if grad is not None and grad.shape == param.shape:
        return grad.detach().clone()
    from ds.full.compat.deepspeed.utils.tensor_fragment import partitioned_full_grad

    try:
        return partitioned_full_grad(param)
    except FeatureNotAvailableError:
        if grad is None and getattr(param, "ds_numel", None) is None:
            return None  # no engine trains it (frozen), or no gradient yet
        raise


safe_update_full_grad_vectorized = missing_function(
    "deepspeed.utils.safe_update_full_grad_vectorized",
    "updating several parameters' gradients through the engine",
    "scale or replace gradients in a backward hook instead",
)  # fmt: skip
safe_set_full_grad = missing_function(
    "deepspeed.utils.safe_set_full_grad", "writing one parameter's gradient through the engine",
    "scale or replace gradients in a backward hook instead",
)  # fmt: skip

__all__ = [
    "RepeatingLoader",
    "log_dist",
    "logger",
    "safe_get_full_fp32_param",
    "safe_get_full_grad",
    "safe_get_full_optimizer_state",
    "safe_get_local_fp32_param",
    "safe_get_local_grad",
    "safe_get_local_optimizer_state",
    "safe_set_full_fp32_param",
    "safe_set_full_grad",
    "safe_set_full_optimizer_state",
    "safe_set_local_fp32_param",
    "safe_set_local_grad",
    "safe_set_local_optimizer_state",
    "safe_update_full_grad_vectorized",
    "set_log_level_from_string",
    "set_random_seed",
    "apply_zero_leaf_module_config",
    "get_z3_leaf_modules",
    "set_z3_leaf_module",
    "set_z3_leaf_modules",
    "set_z3_leaf_modules_by_name",
    "set_z3_leaf_modules_by_suffix",
    "unset_z3_leaf_modules",
    "z3_leaf_module",
    "z3_leaf_parameter",
]
