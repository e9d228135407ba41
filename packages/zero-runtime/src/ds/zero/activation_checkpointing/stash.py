"""Where a checkpointed segment's inputs wait for backward: whole, split across the ranks that
hold identical copies (partition_activations), on the host (cpu_checkpointing), and/or packed
into reusable contiguous buffers (contiguous_memory_optimization)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ds.zero.activation_checkpointing.settings import CheckpointSettings


@dataclass
class Stashed:
    data: torch.Tensor  # whole tensor, or this rank's slice of the flattened tensor
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    partitioned: bool


class ContiguousPool:
    """One flat buffer per checkpoint position, reused step after step: saved inputs do not
    fragment the allocator with many short-lived tensors of varying sizes."""

    def __init__(self) -> None:
        self.buffers: dict[int, torch.Tensor] = {}
        self.cursor: dict[int, int] = {}

    def take(self, slot: int, src: torch.Tensor, device: torch.device) -> torch.Tensor:
        n = src.numel()
        buf = self.buffers.get(slot)
        start = self.cursor.get(slot, 0)
        if buf is None or buf.dtype != src.dtype or buf.numel() < start + n:
            # Grow (this happens on the first steps only); earlier views keep their old storage.
            grown = torch.empty(
                max(start + n, 2 * (buf.numel() if buf is not None else 0)),
                dtype=src.dtype,
                device=device,
            )
            self.buffers[slot] = buf = grown
        out = buf[start : start + n]
        out.copy_(src.reshape(-1))
        self.cursor[slot] = start + n
        return out.view(src.shape)

    def reset(self, slot: int) -> None:
        self.cursor[slot] = 0


POOL = ContiguousPool()


def stash(t: torch.Tensor, s: CheckpointSettings, slot: int) -> Stashed:
    device = t.device
    data = t.detach()
    partitioned = False
    world = s.partition_world
    if world > 1 and data.numel() >= world:
        assert s.comm is not None
        rank = s.comm.get_rank(s.group)
        per = -(-data.numel() // world)
        flat = data.reshape(-1)
        data = flat[rank * per : min(flat.numel(), (rank + 1) * per)].clone()
        partitioned = True
    target = torch.device("cpu") if s.cpu_checkpointing else device
    if s.contiguous_memory_optimization:
        data = POOL.take(slot, data, target)
    elif data.device != target:
        data = data.to(target, non_blocking=True)
    return Stashed(data, t.shape, t.dtype, device, t.requires_grad, partitioned)


def unstash(st: Stashed, s: CheckpointSettings) -> torch.Tensor:
    data = st.data.to(st.device)
    if st.partitioned:
        assert s.comm is not None
        world = s.comm.get_world_size(s.group)
        numel = 1
        for d in st.shape:
            numel *= d
        per = -(-numel // world)
        piece = torch.zeros(per, dtype=st.dtype, device=st.device)
        piece[: data.numel()].copy_(data)
        full = torch.empty(per * world, dtype=st.dtype, device=st.device)
        s.comm.all_gather_into_tensor(full, piece, group=s.group)
        data = full[:numel].view(st.shape)
    out = data.detach().view(st.shape)
    if s.contiguous_memory_optimization and out.data_ptr() == st.data.data_ptr():
        out = out.clone()  # the pooled buffer is reused by the next step's forward
    out.requires_grad_(st.requires_grad)
    return out
