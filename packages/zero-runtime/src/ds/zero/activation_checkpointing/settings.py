"""Process-wide activation-checkpointing settings (the ``activation_checkpointing`` section)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ds.interfaces.comm import Communicator
from ds.interfaces.errors import ConfigError


@dataclass
class CheckpointSettings:
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    contiguous_memory_optimization: bool = False
    number_checkpoints: int | None = None
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False
    # The group whose ranks hold *identical* activations (a model-parallel group); saved inputs
    # are split across it. None: nothing to split across (each rank keeps whole inputs).
    comm: Communicator | None = None
    group: Any = None

    @property
    def partition_world(self) -> int:
        if self.comm is None or not self.partition_activations:
            return 1
        return int(self.comm.get_world_size(self.group))


SETTINGS = CheckpointSettings()

_KEYS = {
    "partition_activations",
    "cpu_checkpointing",
    "contiguous_memory_optimization",
    "number_checkpoints",
    "synchronize_checkpoint_boundary",
    "profile",
}


def configure(
    mpu_: Any = None,
    deepspeed_config: Mapping[str, Any] | Any = None,
    partition_activations: bool | None = None,
    contiguous_checkpointing: bool | None = None,
    num_checkpoints: int | None = None,
    checkpoint_in_cpu: bool | None = None,
    synchronize: bool | None = None,
    profile: bool | None = None,
    *,
    comm: Communicator | None = None,
    group: Any = None,
    cpu_checkpointing: bool | None = None,
    contiguous_memory_optimization: bool | None = None,
    number_checkpoints: int | None = None,
    synchronize_checkpoint_boundary: bool | None = None,
) -> CheckpointSettings:
    """Set how :func:`checkpoint` saves inputs. Accepts DeepSpeed's argument names and the config
    section's names; ``deepspeed_config`` may be the whole config dict, its
    ``activation_checkpointing`` section, or a config object with that attribute. ``mpu_`` may be
    an object with ``get_model_parallel_group()``; ``comm``/``group`` name the ranks that hold
    identical activations (split across when ``partition_activations``)."""
    global SETTINGS
    s = CheckpointSettings()
    section: Any = deepspeed_config
    if section is not None and not isinstance(section, Mapping):
        section = getattr(section, "activation_checkpointing", section)
        section = section.model_dump() if hasattr(section, "model_dump") else vars(section)
    if isinstance(section, Mapping):
        section = section.get("activation_checkpointing", section)
        unknown = set(section) - _KEYS
        if unknown:
            raise ConfigError(
                f"activation_checkpointing has unknown keys {sorted(unknown)}; known keys are "
                f"{sorted(_KEYS)}"
            )
        for k, v in section.items():
            setattr(s, k, v)
    overrides = {
        "partition_activations": partition_activations,
        "contiguous_memory_optimization": (
            contiguous_memory_optimization
            if contiguous_memory_optimization is not None
            else contiguous_checkpointing
        ),
        "number_checkpoints": number_checkpoints
        if number_checkpoints is not None
        else num_checkpoints,
        "cpu_checkpointing": cpu_checkpointing
        if cpu_checkpointing is not None
        else checkpoint_in_cpu,
        "synchronize_checkpoint_boundary": (
            synchronize_checkpoint_boundary
            if synchronize_checkpoint_boundary is not None
            else synchronize
        ),
        "profile": profile,
    }
    for k, v in overrides.items():
        if v is not None:
            setattr(s, k, v)
    if mpu_ is not None and group is None and hasattr(mpu_, "get_model_parallel_group"):
        group = mpu_.get_model_parallel_group()
    s.comm, s.group = comm, group
    SETTINGS = s
    return s


def is_configured() -> bool:
    return CheckpointSettings() != SETTINGS


def current() -> CheckpointSettings:
    return SETTINGS
