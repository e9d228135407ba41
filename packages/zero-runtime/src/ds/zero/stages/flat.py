"""Flat, padded parameter buffers: the layout behind stages 0-2.

A group's parameters become views into one contiguous buffer whose length is padded to a multiple
of the world size, so rank ``r`` owns elements ``[r * P, (r + 1) * P)`` with ``P = padded / world``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Segment:
    """The part of one parameter that falls inside a flat range."""

    index: int  # position of the parameter in the group
    param_offset: int  # first element inside the flattened parameter
    flat_offset: int  # the same element's position in the flat buffer
    numel: int


class FlatGroup:
    def __init__(
        self,
        params: list[torch.nn.Parameter],
        names: list[str],
        world_size: int,
        rank: int,
    ) -> None:
        self.params = params
        self.names = names
        self.world_size = world_size
        self.rank = rank
        self.offsets: list[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.padded = -(-max(total, 1) // world_size) * world_size
        self.partition_numel = self.padded // world_size
        dtype = params[0].dtype if params else torch.float32
        device = params[0].device if params else torch.device("cpu")
        self.dtype = dtype
        self.flat = torch.zeros(self.padded, dtype=dtype, device=device)
        with torch.no_grad():
            for p, off in zip(params, self.offsets):
                self.flat[off : off + p.numel()].copy_(p.detach().reshape(-1))
                p.data = self.flat[off : off + p.numel()].view_as(p)

    def view(self, buffer: torch.Tensor, index: int) -> torch.Tensor:
        off = self.offsets[index]
        p = self.params[index]
        return buffer[off : off + p.numel()].view_as(p)

    def partition_range(self, rank: int | None = None) -> tuple[int, int]:
        r = self.rank if rank is None else rank
        return r * self.partition_numel, (r + 1) * self.partition_numel

    def segments(self, start: int, stop: int) -> list[Segment]:
        """Parameters overlapping flat elements ``[start, stop)`` (padding excluded)."""
        out: list[Segment] = []
        for i, (p, off) in enumerate(zip(self.params, self.offsets)):
            lo, hi = max(start, off), min(stop, off + p.numel())
            if lo < hi:
                out.append(Segment(i, lo - off, lo, hi - lo))
        return out

    def owners(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(rank, lo, hi) pieces of ``[start, stop)`` split at partition boundaries."""
        out = []
        p = self.partition_numel
        r = start // p
        while start < stop:
            hi = min(stop, (r + 1) * p)
            out.append((r, start, hi))
            start, r = hi, r + 1
        return out


def build_buckets(group: FlatGroup, bucket_numel: int) -> list[tuple[int, int, list[int]]]:
    """Cut the group into buckets in backward order (last parameter first).

    Returns ``(flat_start, flat_stop, param_indices)``; each bucket is a contiguous flat range.
    The padding sits after the last parameter, so it joins the first bucket (where backward starts).
    """
    buckets: list[tuple[int, int, list[int]]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(group.params))):
        current.append(i)
        size += group.params[i].numel()
        if size >= bucket_numel:
            buckets.append(_close(group, current, first=not buckets))
            current, size = [], 0
    if current or not buckets:
        buckets.append(_close(group, current, first=not buckets))
    return buckets


def _close(group: FlatGroup, indices: list[int], first: bool) -> tuple[int, int, list[int]]:
    if not indices:
        return (0, group.padded, [])
    start = group.offsets[min(indices)]
    stop = group.offsets[max(indices)] + group.params[max(indices)].numel()
    if first:
        stop = group.padded
    return (start, stop, indices)
