"""``deepspeed.module_inject.layers``: tensor-parallel linear layers built from a module and the
TP group (:mod:`ds.parallel.tp.layers`). ``LinearLayer`` splits the output features (column
parallel; ``gather_output`` all-gathers the result), ``LinearAllreduce`` the input features (row
parallel, output all-reduced); the fused-weight layers cut per sub-parameter. Every parameter
carries its universal-checkpoint record (:mod:`ds.parallel.tp.uc_layout`), and
``collect_autotp_universal_checkpoint_info`` gathers the model's ``universal_checkpoint_info``
from them."""

from __future__ import annotations

from typing import Any

from torch import nn

from ds.full.compat.deepspeed.module_inject.sub_param_layers import (
    GateUpPack_LinearLayer,
    SubParamLinearAllreduce,
    SubParamLinearLayer,
    _subparam_shard_widths,
    fused_LinearLayer,
)
from ds.full.compat.deepspeed.module_inject.tp_linear import (
    LinearAllreduce,
    LinearLayer,
    LmHeadLinearAllreduce,
    TensorParallel_Layer,
    Yuan_LinearAllreduce,
    Yuan_LinearLayer,
    tp_group,
)
from ds.parallel.tp.uc_layout import collect_universal_info
from ds.parallel.tp.uc_layout import conversion_view as _get_param_uc_conversion_meta
from ds.parallel.tp.uc_layout import layout_record as _build_param_uc_restore_meta


def collect_autotp_universal_checkpoint_info(model: nn.Module) -> dict[str, Any]:
    """The model's ``universal_checkpoint_info``: each TP layer first records its parameters
    again (their slices may have changed since it was built), then the records are gathered."""
    for module in model.modules():
        refresh = getattr(module, "_mark_uc_metadata", None)
        if refresh is not None:
            refresh()
    return collect_universal_info(model)


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


__all__ = [
    "GateUpPack_LinearLayer",
    "LinearAllreduce",
    "LinearLayer",
    "LmHeadLinearAllreduce",
    "SubParamLinearAllreduce",
    "SubParamLinearLayer",
    "TensorParallel_Layer",
    "Yuan_LinearAllreduce",
    "Yuan_LinearLayer",
    "_build_param_uc_restore_meta",
    "_get_param_uc_conversion_meta",
    "_subparam_shard_widths",
    "collect_autotp_universal_checkpoint_info",
    "fused_LinearLayer",
    "get_auto_tp_mode",
    "is_autotp_training_mode",
    "set_autotp_mode",
    "tp_group",
]
