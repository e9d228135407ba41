"""A ds tensor read from a DeepSpeed checkpoint: element ranges of DeepSpeed's flat partitions
(loaded lazily, memory-mapped), assembled into whatever range a ds rank asks for."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.checkpoint import TensorMeta
from ds.interfaces.errors import CheckpointError


@dataclass(frozen=True)
class _Piece:
    """Elements [start, start + numel) of a logical tensor are ``flat[local : local + numel]``."""

    start: int
    numel: int
    source: Callable[[], torch.Tensor]  # the flat 1-D tensor (loaded lazily, memory-mapped)
    local: int


@dataclass
class _Logical:
    meta: TensorMeta
    pieces: list[_Piece]

    def read(self, offset: int, numel: int) -> torch.Tensor:
        out = torch.empty(numel, dtype=getattr(torch, self.meta.dtype))
        stop, filled = offset + numel, 0
        for p in self.pieces:
            lo, hi = max(offset, p.start), min(stop, p.start + p.numel)
            if lo >= hi:
                continue
            flat = p.source().reshape(-1)
            out[lo - offset : hi - offset].copy_(
                flat[p.local + lo - p.start : p.local + hi - p.start]
            )
            filled += hi - lo
        if filled != numel:
            raise CheckpointError(
                f"the DeepSpeed checkpoint holds only {filled} of elements [{offset}, {stop}) of "
                f"{self.meta.name!r}; the checkpoint is incomplete"
            )
        return out


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _numel(shape: Any) -> int:
    return int(math.prod(int(s) for s in shape))
