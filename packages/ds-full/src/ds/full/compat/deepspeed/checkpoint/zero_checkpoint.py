"""``deepspeed.checkpoint.zero_checkpoint.ZeROCheckpoint``: a tag's ZeRO files by target rank
(:class:`ds.checkpoint.deepspeed_3d.ZeroFiles`)."""

from __future__ import annotations

from ds.checkpoint.deepspeed_3d import ZeroFiles as ZeROCheckpoint

GROUP_STATE_KEY = "state"

__all__ = ["ZeROCheckpoint"]
