"""Reassemble full tensors from tensor-parallel slices (for checkpoint export)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ds.interfaces.parallel import join_slices, tp_dim, tp_fused

from ._collectives import TPGroup
from .autotp import tp_group_of


def unshard(pieces: list[torch.Tensor], dim: int, fused: int = 1) -> torch.Tensor:
    """The full tensor from every rank's slice, in TP-rank order (inverse of layers.shard)."""
    return join_slices(pieces, dim, fused)  # type: ignore[no-any-return]


def gather_tensor(t: torch.Tensor, tp: TPGroup, dim: int, fused: int = 1) -> torch.Tensor:
    """All-gather one sliced tensor over the TP group and reassemble it (collective)."""
    local = t.detach().contiguous()
    if tp.size == 1:
        return local
    pieces = [torch.empty_like(local) for _ in range(tp.size)]
    tp.comm.all_gather(pieces, local, group=tp.group)
    return unshard(pieces, dim, fused)


def gather_full_state_dict(
    model: nn.Module, comm: Any, mesh: Any = None, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """The model's state dict with every TP-sliced parameter reassembled to its full shape (keys
    as the unsplit model has them, tied names included). Collective over the TP group: call it
    on every rank of the group. ``mesh``: a ParallelMesh or a TP group handle (None: the world)."""
    tp = tp_group_of(mesh, comm)
    out: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        dim = tp_dim(value)
        full = value.detach() if dim is None else gather_tensor(value, tp, dim, tp_fused(value))
        out[name] = full.to(device).clone()
    return out


__all__ = ["gather_full_state_dict", "gather_tensor", "unshard"]
