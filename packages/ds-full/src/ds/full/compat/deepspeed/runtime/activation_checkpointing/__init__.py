"""``deepspeed.runtime.activation_checkpointing``: see :mod:`.checkpointing`."""

from ds.full.compat.deepspeed.runtime.activation_checkpointing import checkpointing

__all__ = ["checkpointing"]
