"""``deepspeed.runtime.zero.tiling``: ds's tiled linear layers (ds.zero.stage3.tiling)."""

from __future__ import annotations

import torch

from ds.zero.stage3.tiling import TiledLinear, TiledLinearReturnBias


def split_tensor_along_last_dim(
    tensor: torch.Tensor, partitions: list[int], contiguous_split_chunks: bool = False
) -> tuple[torch.Tensor, ...]:
    """``tensor`` cut along its last dimension into chunks of the given sizes."""
    chunks = torch.split(tensor, partitions, dim=-1)
    return tuple(c.contiguous() for c in chunks) if contiguous_split_chunks else chunks


__all__ = ["TiledLinear", "TiledLinearReturnBias", "split_tensor_along_last_dim"]
