"""``deepspeed.checkpoint.deepspeed_checkpoint.DeepSpeedCheckpoint``: a tag's files, saved and
target (pp, tp, dp) degrees and recorded metadata
(:class:`ds.checkpoint.deepspeed_3d.CheckpointLayout`)."""

from __future__ import annotations

from ds.checkpoint.deepspeed_3d import CheckpointLayout as DeepSpeedCheckpoint

ARGS_KEY = "args"
CHECKPOINT_INFO_KEY = "checkpoint_info"
ITERATION_KEY = "iteration"

__all__ = ["DeepSpeedCheckpoint"]
