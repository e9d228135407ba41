"""``deepspeed.runtime.zero.utils``: the ZeRO helpers scripts and integrations import.

``is_zero_param`` is ds's stage-3 ``is_partitioned`` (a parameter ``zero.Init`` or the stage-3
engine has cut into shards); ``ZeRORuntimeException`` is ds's error root, which the engine raises
(as a subclass naming the problem) where DeepSpeed raises this exception; the supported-optimizer
list holds the optimizers ds's ZeRO stages step from the optimizer object a user hands them,
offloaded or not. The cross-rank list checks have no ds counterpart and say so when called.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.full.compat.deepspeed._missing import missing_function
from ds.interfaces.errors import DsError
from ds.zero.stage3.shard import is_partitioned

ZeRORuntimeException = DsError


def is_zero_param(parameter: Any) -> bool:
    return torch.is_tensor(parameter) and is_partitioned(parameter)


def _supported() -> list[type]:
    # Imported on first use: the CPU optimizers load ds.ops' kernels.
    from ds.full.compat.deepspeed.ops.adam import FusedAdam
    from ds.full.compat.deepspeed.ops.lion import FusedLion
    from ds.ops.optim.adagrad import CPUAdagrad
    from ds.ops.optim.adam import CPUAdam
    from ds.ops.optim.lion import CPULion

    return [
        torch.optim.Adam,
        torch.optim.AdamW,
        torch.optim.Adagrad,
        FusedAdam,
        CPUAdam,
        CPUAdagrad,
        CPULion,
        FusedLion,
    ]


def is_zero_supported_optimizer(optimizer: Any) -> bool:
    return type(optimizer) in _supported()


def __getattr__(name: str) -> Any:
    if name == "ZERO_SUPPORTED_OPTIMIZERS":
        globals()[name] = _supported()
        return globals()[name]
    raise AttributeError(f"deepspeed.runtime.zero.utils.{name} has no ds equivalent")


_HINT = "ds checks that ranks agree inside its collectives (ds.zero.stage3.collectives)"
get_lst_from_rank0 = missing_function(
    "deepspeed.runtime.zero.utils.get_lst_from_rank0", "a rank-0 list broadcast helper", _HINT
)
assert_ints_same_as_other_ranks = missing_function(
    "deepspeed.runtime.zero.utils.assert_ints_same_as_other_ranks",
    "a cross-rank integer check",
    _HINT,
)
assert_lst_len_same_as_other_ranks = missing_function(
    "deepspeed.runtime.zero.utils.assert_lst_len_same_as_other_ranks",
    "a cross-rank list-length check",
    _HINT,
)
apply_to_tensors_only = missing_function(
    "deepspeed.runtime.zero.utils.apply_to_tensors_only",
    "DeepSpeed's stage-3 forward-hook tensor walker",
    "ds's stage 3 hooks walk module outputs with ds.zero.stage3.external_access.tensors_in",
)

__all__ = [
    "ZeRORuntimeException",
    "apply_to_tensors_only",
    "assert_ints_same_as_other_ranks",
    "assert_lst_len_same_as_other_ranks",
    "get_lst_from_rank0",
    "is_zero_param",
    "is_zero_supported_optimizer",
]
