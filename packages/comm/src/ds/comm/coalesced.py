"""Coalesced collectives over lists of unevenly sized tensors: one collective per list.

Layout (world size W, tensor i with n_i elements, chunk c_i = ceil(n_i / W)): tensor i is flattened,
zero-padded to W * c_i and cut into W chunks; rank r owns elements [r * c_i, (r + 1) * c_i). The
flat buffer a rank sends or receives is [chunk of t_0 | chunk of t_1 | ...] for every rank in turn,
so a single ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` moves the whole list.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch

from ds.interfaces.comm import Communicator, ReduceOp
from ds.interfaces.errors import CommError


def chunk_sizes(numels: Sequence[int], world: int) -> list[int]:
    """Per-rank chunk length of each tensor: ceil(n / world)."""
    return [-(-int(n) // world) for n in numels]


def _check_same_dtype(tensors: Sequence[torch.Tensor], what: str) -> None:
    if not tensors:
        raise CommError(f"{what} needs at least one tensor; got an empty list")
    dtype, device = tensors[0].dtype, tensors[0].device
    for i, t in enumerate(tensors):
        if t.dtype != dtype or t.device != device:
            raise CommError(
                f"{what} needs tensors of one dtype and device; tensor 0 is {dtype} on {device} "
                f"but tensor {i} is {t.dtype} on {t.device}; bucket tensors by dtype first"
            )


class CoalescedWork:
    """Handle of an ``async_op=True`` coalesced collective; ``outputs`` are valid after ``wait``."""

    __slots__ = ("_finish", "_handle", "outputs")

    def __init__(self, handle: Any, outputs: list[torch.Tensor], finish: Any = None) -> None:
        self._handle = handle
        self.outputs = outputs
        self._finish = finish

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        if self._handle is not None:
            self._handle.wait(timeout)
            self._handle = None
        finish, self._finish = self._finish, None
        if finish is not None:
            finish()
        return True

    def is_completed(self) -> bool:
        return self._handle is None or bool(self._handle.is_completed())


def reduce_scatter_coalesced(
    comm: Communicator,
    tensors: Sequence[torch.Tensor],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Reduce every tensor across ranks; return this rank's chunk of each (length ceil(n_i / W)).

    Chunks past a tensor's end are zero padding. With ``async_op=True`` returns a
    :class:`CoalescedWork` whose ``outputs`` hold the chunks once waited on.
    """
    _check_same_dtype(tensors, "reduce_scatter_coalesced")
    world = comm.get_world_size(group)
    numels = [t.numel() for t in tensors]
    chunks = chunk_sizes(numels, world)
    per_rank = sum(chunks)
    ref = tensors[0]
    flat = torch.zeros(world * per_rank, dtype=ref.dtype, device=ref.device)
    grid = flat.view(world, per_rank)
    off = 0
    for t, n, c in zip(tensors, numels, chunks):
        # Copy tensor i into column block [off, off + c) of every rank's row, padding the tail.
        padded = torch.zeros(world * c, dtype=ref.dtype, device=ref.device)
        padded[:n].copy_(t.reshape(-1))
        grid[:, off : off + c].copy_(padded.view(world, c))
        off += c
    out = torch.empty(per_rank, dtype=ref.dtype, device=ref.device)
    outputs = list(torch.split(out, chunks))
    handle = comm.reduce_scatter_tensor(out, flat, op, group, async_op)
    if async_op:
        return CoalescedWork(handle, outputs)
    return outputs


def all_gather_coalesced(
    comm: Communicator,
    shards: Sequence[torch.Tensor],
    numels: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Gather every rank's shard of each tensor; return the full flat tensors.

    ``numels[i]`` is the full length of tensor i; this rank's shard may be shorter than
    ceil(n_i / W) (the uneven tail of a partition) and is zero-padded. Without ``numels`` every
    shard is taken as full-size and tensor i has ``W * shards[i].numel()`` elements.
    """
    _check_same_dtype(shards, "all_gather_coalesced")
    world = comm.get_world_size(group)
    if numels is None:
        numels = [world * s.numel() for s in shards]
    if len(numels) != len(shards):
        raise CommError(
            f"all_gather_coalesced got {len(shards)} shards but {len(numels)} numels; "
            "pass one full length per shard"
        )
    chunks = chunk_sizes(numels, world)
    for i, (s, c) in enumerate(zip(shards, chunks)):
        if s.numel() > c:
            raise CommError(
                f"all_gather_coalesced: shard {i} has {s.numel()} elements but a tensor of "
                f"{numels[i]} elements split over {world} ranks has chunks of {c}"
            )
    per_rank = sum(chunks)
    ref = shards[0]
    send = torch.zeros(per_rank, dtype=ref.dtype, device=ref.device)
    for piece, s in zip(torch.split(send, chunks), shards):
        piece[: s.numel()].copy_(s.reshape(-1))
    recv = torch.empty(world * per_rank, dtype=ref.dtype, device=ref.device)
    outputs = [torch.empty(int(n), dtype=ref.dtype, device=ref.device) for n in numels]

    def unflatten() -> None:
        grid = recv.view(world, per_rank)
        off = 0
        for out, n, c in zip(outputs, numels, chunks):
            out.copy_(grid[:, off : off + c].reshape(-1)[: int(n)])
            off += c

    handle = comm.all_gather_into_tensor(recv, send, group, async_op)
    if async_op:
        return CoalescedWork(handle, outputs, unflatten)
    unflatten()
    return outputs


__all__ = ["CoalescedWork", "all_gather_coalesced", "chunk_sizes", "reduce_scatter_coalesced"]
