"""``deepspeed.runtime.constants``: the config's key names and defaults, read off ds's config
model (one schema): for every top-level key ``name``, ``NAME = "name"`` and ``NAME_DEFAULT``;
DeepSpeed's other names (``ROUTE_*``, the parallel group names) are listed below."""

from __future__ import annotations

from typing import Any

from ds.zero.config.model import DsConfig


def _views() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in DsConfig.model_fields.items():
        key = field.alias or name
        out[key.upper()] = key
        if not field.is_required():
            default = field.get_default(call_default_factory=True)
            out[f"{key.upper()}_DEFAULT"] = (
                default.model_dump() if hasattr(default, "model_dump") else default
            )
    return out


globals().update(_views())

ROUTE_TRAIN, ROUTE_EVAL, ROUTE_PREDICT, ROUTE_ENCODE = "train", "eval", "predict", "encode"
TYPE = "type"
OPTIMIZER_PARAMS = SCHEDULER_PARAMS = "params"
OPTIMIZER_TYPE_DEFAULT = SCHEDULER_TYPE_DEFAULT = None
MAX_GRAD_NORM = "max_grad_norm"
BFLOAT16 = "bf16"
BFLOAT16_OLD = "bfloat16"
FP16 = "fp16"
ZERO_OPTIMIZATION = "zero_optimization"
DATA_PARALLEL_GROUP = "data_parallel_group"
GLOBAL_RANK = "global_rank"
