"""``deepspeed.module_inject.layers``: tensor-parallel linear layers built from a module and the
TP group (:mod:`ds.parallel.tp.layers`). ``LinearLayer`` splits the output features (column
parallel; ``gather_output`` all-gathers the result), ``LinearAllreduce`` the input features (row
parallel, output all-reduced)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ds.parallel.tp import ColumnParallelLinear, RowParallelLinear, TPGroup, tp_group_of


def tp_group(mp_group: Any, mp_size: int | None = None) -> TPGroup:
    """The TP group as ds's layers see it: ``mp_group`` on the job's communicator (None: the
    whole world); a group of one for ``mp_size=1``, or when no group is named and the job has
    no communicator."""
    if isinstance(mp_group, TPGroup):
        return mp_group
    from ds import comm as dist

    alone = mp_group is None and mp_size is None and not dist.is_initialized()
    if mp_size == 1 or alone:
        return TPGroup(None, mp_group, 1, 0)
    if not dist.is_initialized():
        raise RuntimeError(
            f"a tensor-parallel size of {mp_size} needs the job's communicator; call "
            "deepspeed.init_distributed() first"
        )
    return tp_group_of(mp_group, dist.get_communicator())


# Whether AutoTP builds layers for training (groups from deepspeed.utils.groups) or for
# inference (the group handed to it); DeepSpeed's process-wide switch.
_TRAINING = False


def set_autotp_mode(training: bool = False) -> None:
    global _TRAINING
    _TRAINING = bool(training)


def is_autotp_training_mode() -> bool:
    return _TRAINING


def get_auto_tp_mode() -> Any:
    from ds.full.compat.deepspeed.runtime.tensor_parallel.config import AUTOTP_MODE

    return AUTOTP_MODE.TRAINING if _TRAINING else AUTOTP_MODE.INFERENCE


class LinearLayer(ColumnParallelLinear):
    def __init__(
        self,
        module: nn.Module,
        mp_group: Any = None,
        *,
        name: str | None = None,
        gather_output: bool = False,
        fused: int = 1,
        **_: Any,
    ) -> None:
        tp = tp_group(mp_group)
        built = ColumnParallelLinear.from_module(
            module, tp, gather_output=gather_output, fused=fused
        )
        super().__init__(built.weight, built.bias, tp, gather_output=gather_output, fused=fused)
        self.name = name


class LinearAllreduce(RowParallelLinear):
    def __init__(
        self, module: nn.Module, mp_group: Any = None, *, name: str | None = None, **_: Any
    ) -> None:
        tp = tp_group(mp_group)
        built = RowParallelLinear.from_module(module, tp)
        super().__init__(built.weight, built.bias, tp, transposed=False)
        self.name = name


__all__ = [
    "LinearAllreduce",
    "LinearLayer",
    "get_auto_tp_mode",
    "is_autotp_training_mode",
    "set_autotp_mode",
    "tp_group",
]
