"""Helpers that cut whole tensors into flat shards and ask for even slices (tests, tools, users)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ds.checkpoint._reader import dtype_name
from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, ShardedTensor, TensorMeta


def even_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of the flat elements rank ``rank`` holds when ``numel`` is split evenly."""
    per = -(-numel // world_size) if numel else 0
    start = min(numel, rank * per)
    return start, min(numel, start + per)


def shard_state(
    tensors: Mapping[str, torch.Tensor], rank: int, world_size: int
) -> ShardedStateDict:
    """This rank's even flat shard of every tensor (what a ZeRO-3 partition looks like)."""
    out = ShardedStateDict()
    for name, t in tensors.items():
        meta = TensorMeta(name, tuple(t.shape), dtype_name(t.dtype))
        start, stop = even_range(t.numel(), rank, world_size)
        local = t.detach().reshape(-1)[start:stop]
        out.tensors[name] = ShardedTensor(meta, start, local)
    return out


def even_requests(metas: Iterable[TensorMeta], rank: int, world_size: int) -> list[LoadRequest]:
    """The requests a rank of a ``world_size`` job makes to load its even shard of each tensor."""
    out = []
    for meta in metas:
        start, stop = even_range(meta.numel, rank, world_size)
        out.append(LoadRequest(meta.name, start, stop - start))
    return out


def full_requests(metas: Iterable[TensorMeta]) -> list[LoadRequest]:
    return [LoadRequest(m.name, 0, m.numel) for m in metas]
