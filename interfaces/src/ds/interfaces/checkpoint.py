"""Sharded state dicts with global metadata, and the CheckpointEngine contract.

A logical tensor (a parameter, an optimizer moment) may be split across ranks. Each rank holds
contiguous ranges of the tensor's *flattened* elements, which covers every ZeRO layout (flat
partitions cut through tensors at arbitrary element offsets) and row-wise sharding alike. A loader
asks for the ranges it needs and receives exactly those, whatever world size wrote them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorMeta:
    """Global description of one logical tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ShardedTensor:
    """This rank's piece of a logical tensor: flattened elements [offset, offset + local.numel())."""

    meta: TensorMeta
    offset: int
    local: torch.Tensor  # 1-D, contiguous, CPU or device

    @property
    def stop(self) -> int:
        return self.offset + int(self.local.numel())


@dataclass
class ShardedStateDict:
    """What a rank saves or loads: its tensor shards plus non-tensor state.

    ``objects`` holds state that is identical on every rank (step, scheduler, config), written once;
    ``rank_objects`` holds per-rank state (RNG streams), written by each rank.
    """

    tensors: dict[str, ShardedTensor] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)
    rank_objects: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadRequest:
    """Ask for elements [offset, offset + numel) of the flattened logical tensor ``name``."""

    name: str
    offset: int
    numel: int


@runtime_checkable
class SaveHandle(Protocol):
    def wait(self) -> None: ...  # re-raises any error of a background save
    def done(self) -> bool: ...


@runtime_checkable
class CheckpointEngine(Protocol):
    """Writes and reads sharded checkpoints atomically; loads reshard on read."""

    def save(
        self, directory: str, tag: str, state: ShardedStateDict, *, async_save: bool = False
    ) -> SaveHandle: ...
    def load(
        self,
        directory: str,
        tag: str | None,
        requests: Sequence[LoadRequest],
        *,
        rank_objects: bool = True,
    ) -> ShardedStateDict: ...
    def latest_tag(self, directory: str) -> str | None: ...
    def metadata(self, directory: str, tag: str | None = None) -> Mapping[str, TensorMeta]: ...
    def wait(self) -> None: ...  # the last async save has committed (or raised)


@runtime_checkable
class RecoveryScriptWriter(Protocol):
    """A checkpoint engine that can leave, in a save directory beside its ``latest``, the script
    that consolidates the checkpoints there into one model (``zero_to_fp32.py``, where DeepSpeed's
    users look for it). A training engine asks for it when it saves a ZeRO checkpoint."""

    def write_recovery_script(self, directory: str) -> str: ...  # the path written
