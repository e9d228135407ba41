"""``deepspeed.runtime.zero.partition_parameters``: the names transformers uses around
``zero.Init``.

transformers' ``prevent_arange_dtype_change()`` (entered before ``deepspeed.zero.Init`` whenever a
ZeRO-3 model is built from a config or ``from_pretrained``) swaps
``zero_wrapper_for_fp_tensor_constructor`` and compares against ``_orig_torch_arange``. DeepSpeed's
``zero.Init`` re-types tensor constructors through that wrapper; ds's ``zero.Init`` does not touch
tensor constructors (it partitions each module's parameters as the module is built), so the
wrapper here is DeepSpeed's contract for whoever calls it, and ds itself never does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.full.compat.deepspeed.accelerator import get_accelerator
from ds.full.compat.deepspeed.runtime.zero.linear import zero3_linear_wrap
from ds.full.compat.deepspeed.runtime.zero.zero_init import Init
from ds.full.compat.deepspeed.zero import GatheredParameters
from ds.zero.init import Init as InsertPostInitMethodToModuleSubClasses
from ds.zero.init import single_rank_group_contradiction
from ds.zero.stage3.shard import ParamStatus as ZeroParamStatus

# A partitioned parameter's own data is empty; its values live in ``param.ds_tensor``.
partitioned_param_data_shape = [0]

_orig_torch_arange = torch.arange
_orig_torch_empty = torch.empty
_orig_torch_zeros = torch.zeros
_orig_torch_ones = torch.ones
_orig_torch_full = torch.full


def zero_wrapper_for_fp_tensor_constructor(
    fn: Callable[..., torch.Tensor], target_fp_dtype: torch.dtype, target_device: Any = None
) -> Callable[..., torch.Tensor]:
    """``fn`` made to build floating-point tensors in ``target_fp_dtype`` on ``target_device``
    (when no device is given), as DeepSpeed's wrapper does."""

    def wrapped_fn(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") is None and target_device is not None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        return tensor.to(target_fp_dtype) if tensor.is_floating_point() else tensor

    return wrapped_fn


def _contradicting_single_rank_pg_error(
    dp_world_size: int, explicit_process_group: Any, env: Any = None
) -> str | None:
    """The error zero.Init raises when a launcher started several ranks but the group it would
    partition over has one (None when that is not the case)."""
    return single_rank_group_contradiction(dp_world_size, explicit_process_group, env)


class MultipleAllGatherHandles:
    """Several pending gathers waited on as one."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def wait(self, handle_dependency: bool = True) -> None:
        for handle in self.handles:
            handle.wait(handle_dependency=handle_dependency)


__all__ = [
    "GatheredParameters",
    "Init",
    "InsertPostInitMethodToModuleSubClasses",
    "MultipleAllGatherHandles",
    "partitioned_param_data_shape",
    "ZeroParamStatus",
    "get_accelerator",
    "zero3_linear_wrap",
    "zero_wrapper_for_fp_tensor_constructor",
]
