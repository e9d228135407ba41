"""Activation checkpointing: ``checkpoint`` and its configuration (the config section)."""

from ds.zero.activation_checkpointing.core import checkpoint, reset
from ds.zero.activation_checkpointing.settings import (
    CheckpointSettings,
    configure,
    current,
    is_configured,
)

__all__ = ["CheckpointSettings", "checkpoint", "configure", "current", "is_configured", "reset"]
