"""``deepspeed.runtime.utils.PartitionedTensor``: a tensor split evenly over a process group,
each rank keeping its slice of the flattened values, whole again on demand.

The layout is the uniform split of ``numel`` items over the group's ranks (the first ranks one
item more when it does not divide). ``to_meta()`` encodes it as one long tensor,
``[ndim, *shape, num_parts, rank, *bounds]``, which another process can turn back into a
``PartitionedTensor`` with ``from_meta`` and its own local slice.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ds import comm as dist


def _uniform(num_items: int, num_parts: int) -> list[int]:
    from ds.parallel.pipeline.partition import uniform

    return uniform(num_items, num_parts)


class PartitionedTensor:
    def __init__(self, tensor: torch.Tensor, group: Any, partition_meta: Any = None) -> None:
        self.group = group
        self.num_parts = dist.get_world_size(group=group)
        self.rank = dist.get_rank(group=group)
        self.orig_size = list(tensor.size())
        self.orig_device = tensor.device
        self.partition = _uniform(tensor.numel(), self.num_parts)
        lo, hi = self.partition[self.rank], self.partition[self.rank + 1]
        self.local_data = tensor.detach().contiguous().view(-1)[lo:hi].clone()
        self.even_split = tensor.numel() % self.num_parts == 0

    @classmethod
    def from_meta(
        cls, meta: torch.Tensor, local_part: torch.Tensor, group: Any, device: Any = None
    ) -> PartitionedTensor:
        """The tensor that ``to_meta()`` described, with this rank's slice ``local_part``."""
        if meta.dtype != torch.long:
            raise TypeError(f"PartitionedTensor meta must be a long tensor, got {meta.dtype}")
        values = [int(v) for v in meta.tolist()]
        ndim = values[0]
        shape, rest = values[1 : 1 + ndim], values[1 + ndim :]
        obj = cls.__new__(cls)
        obj.group = group
        obj.num_parts = dist.get_world_size(group=group)
        obj.rank = dist.get_rank(group=group)
        if (rest[0], rest[1]) != (obj.num_parts, obj.rank):
            raise ValueError(
                f"PartitionedTensor meta was written for rank {rest[1]} of {rest[0]}; this is "
                f"rank {obj.rank} of {obj.num_parts}"
            )
        obj.orig_size = shape
        obj.orig_device = torch.device(device) if device is not None else local_part.device
        obj.partition = rest[2:]
        obj.local_data = local_part.detach()
        obj.even_split = math.prod(shape) % obj.num_parts == 0
        return obj

    def full(self, device: Any = None) -> torch.Tensor:
        """The whole tensor, gathered from every rank's slice (a collective: all ranks call)."""
        device = self.orig_device if device is None else device
        flat = torch.zeros(math.prod(self.orig_size), dtype=self.local_data.dtype, device=device)
        if self.even_split:
            dist.all_gather_into_tensor(flat, self.local_data.to(device), group=self.group)
        else:
            # Slices differ in length: each owner broadcasts its own into place.
            for part in range(self.num_parts):
                lo, hi = self.partition[part], self.partition[part + 1]
                piece = flat[lo:hi]
                if part == self.rank:
                    piece.copy_(self.local_data)
                src = part if self.group is None else dist.get_global_rank(self.group, part)
                dist.broadcast(piece, src, group=self.group)
        return flat.view(self.orig_size)

    def to_meta(self) -> torch.Tensor:
        meta = [len(self.orig_size), *self.orig_size, self.num_parts, self.rank, *self.partition]
        return torch.tensor(meta, dtype=torch.long, device=self.orig_device)

    def data(self) -> torch.Tensor:
        return self.local_data

    def local_size(self) -> torch.Size:
        return self.local_data.size()

    def full_size(self) -> list[int]:
        return self.orig_size


__all__ = ["PartitionedTensor"]
