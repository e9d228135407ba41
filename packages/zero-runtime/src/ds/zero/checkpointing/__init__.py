"""Activation checkpointing: ``ds.zero.checkpointing.checkpoint`` and its configuration."""

from ds.zero.checkpointing.core import checkpoint, reset
from ds.zero.checkpointing.settings import CheckpointSettings, configure, current, is_configured

__all__ = ["CheckpointSettings", "checkpoint", "configure", "current", "is_configured", "reset"]
