"""``deepspeed.runtime.activation_checkpointing.checkpointing`` (also ``deepspeed.checkpointing``):
ds.zero's activation checkpointing (``checkpoint``, ``configure``, ``is_configured``, ``reset``,
...) under DeepSpeed's module.

DeepSpeed keeps its settings in module globals (``PARTITION_ACTIVATIONS``,
``CONTIGUOUS_CHECKPOINTING``, ``num_layers``, ``CPU_CHECKPOINT``, ``SYNCHRONIZE``,
``PROFILE_TIME``, ``mpu``, ``deepspeed_checkpointing_enabled``); here they read and write
ds.zero's settings, so a script that sets one changes what ``checkpoint`` does.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import ds.zero.activation_checkpointing as _ac
from ds.interfaces.errors import ConfigError
from ds.zero.activation_checkpointing import settings as _settings

# DeepSpeed's global -> ds.zero's CheckpointSettings field
_FIELDS = {
    "PARTITION_ACTIVATIONS": "partition_activations",
    "CONTIGUOUS_CHECKPOINTING": "contiguous_memory_optimization",
    "num_layers": "number_checkpoints",
    "CPU_CHECKPOINT": "cpu_checkpointing",
    "SYNCHRONIZE": "synchronize_checkpoint_boundary",
    "PROFILE_TIME": "profile",
}
_state: dict[str, Any] = {"mpu": None, "enabled": False}


class ContiguousCheckpointingError(ConfigError, AssertionError):
    """DeepSpeed asserts these preconditions of contiguous checkpointing; so does its API here."""


def configure(
    mpu_: Any = None,
    deepspeed_config: Any = None,
    partition_activations: bool | None = None,
    contiguous_checkpointing: bool | None = None,
    num_checkpoints: int | None = None,
    checkpoint_in_cpu: bool | None = None,
    synchronize: bool | None = None,
    profile: bool | None = None,
) -> None:
    """DeepSpeed's ``configure``: the config's ``activation_checkpointing`` section, then the
    arguments given. Contiguous checkpointing needs partitioned activations and the number of
    checkpoints, as in DeepSpeed."""
    s = _ac.configure(
        mpu_, deepspeed_config, partition_activations, contiguous_checkpointing,
        num_checkpoints, checkpoint_in_cpu, synchronize, profile,
    )  # fmt: skip
    if mpu_ is not None:
        _state["mpu"] = mpu_
    _state["enabled"] = True
    if s.contiguous_memory_optimization and not s.partition_activations:
        raise ContiguousCheckpointingError(
            "contiguous checkpointing is only available with partitioned activations: set "
            "partition_activations=True (activation_checkpointing.partition_activations)"
        )
    if s.contiguous_memory_optimization and s.number_checkpoints is None:
        raise ContiguousCheckpointingError(
            "contiguous checkpointing needs the number of layers: pass num_checkpoints= "
            "(activation_checkpointing.number_checkpoints)"
        )


def non_reentrant_checkpoint(function: Any, *args: Any) -> Any:
    """DeepSpeed's non-reentrant variant; ds's ``checkpoint`` already accepts inputs that need
    no gradient, so it is the same function."""
    return _ac.checkpoint(function, *args)


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name in _FIELDS:
            return getattr(_settings.current(), _FIELDS[name])
        if name == "mpu":
            return _state["mpu"]
        if name == "deepspeed_checkpointing_enabled":
            return _state["enabled"]
        try:
            return getattr(_ac, name)
        except AttributeError:
            raise AttributeError(f"deepspeed.checkpointing.{name} has no ds equivalent") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIELDS:
            setattr(_settings.current(), _FIELDS[name], value)
        elif name == "mpu":
            _state["mpu"] = value
        elif name == "deepspeed_checkpointing_enabled":
            _state["enabled"] = bool(value)
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Module

__all__ = ["ContiguousCheckpointingError", "configure", "non_reentrant_checkpoint"]
