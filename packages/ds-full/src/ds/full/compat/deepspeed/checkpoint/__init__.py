"""``deepspeed.checkpoint``: checkpoint helpers integrations use."""

from ds.full.compat.deepspeed.checkpoint import utils

__all__ = ["utils"]
