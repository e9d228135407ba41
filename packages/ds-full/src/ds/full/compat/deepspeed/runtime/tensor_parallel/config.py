"""``deepspeed.runtime.tensor_parallel.config``: the AutoTP mode and the model's transformers
tensor-parallel plan (:func:`ds.parallel.tp.hf_plan.hf_tp_plan`)."""

from __future__ import annotations

from enum import Enum

from ds.parallel.tp.hf_plan import hf_tp_plan as _get_hf_tp_plan


class AUTOTP_MODE(Enum):
    TRAINING = "TRAINING"
    INFERENCE = "INFERENCE"


__all__ = ["AUTOTP_MODE", "_get_hf_tp_plan"]
