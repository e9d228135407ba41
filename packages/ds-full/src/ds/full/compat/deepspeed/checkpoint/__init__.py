"""``deepspeed.checkpoint``: checkpoint helpers and the key names of DeepSpeed's files."""

from ds.full.compat.deepspeed.checkpoint import constants, utils
from ds.full.compat.deepspeed.checkpoint.constants import *  # noqa: F403

__all__ = ["constants", "utils"]
