"""``deepspeed.runtime.engine.DeepSpeedEngine`` -> ``ds.zero.engine.ZeroEngine``."""

from __future__ import annotations

from typing import Any

from ds.zero.engine import ZeroEngine as DeepSpeedEngine


def _mpu_degree(mpu: Any, getters: tuple[str, ...]) -> int:
    for name in getters:
        if hasattr(mpu, name):
            return int(getattr(mpu, name)())
    return 1


def _checkpoint_parallel_metadata(mpu: Any) -> dict[str, dict[str, int]]:
    """The pipeline and tensor degrees a checkpoint's model-state files record, read from a
    Megatron-style ``mpu`` (1 for each without one), so that a converter can tell the layout
    of the files apart without guessing from their count."""
    from ds.full.compat.deepspeed.checkpoint.constants import (
        CHECKPOINT_PARALLEL_DIMS,
        CHECKPOINT_PP_DEGREE,
        CHECKPOINT_TP_DEGREE,
    )

    pp = _mpu_degree(
        mpu, ("get_pipeline_model_parallel_world_size", "get_pipe_parallel_world_size")
    )
    tp = _mpu_degree(
        mpu,
        (
            "get_tensor_model_parallel_world_size",
            "get_slice_parallel_world_size",
            "get_model_parallel_world_size",
        ),
    )
    return {CHECKPOINT_PARALLEL_DIMS: {CHECKPOINT_PP_DEGREE: pp, CHECKPOINT_TP_DEGREE: tp}}


__all__ = ["DeepSpeedEngine"]
