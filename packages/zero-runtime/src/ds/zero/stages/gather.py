"""The parameter all-gather of stages 1-2: every rank's updated partition into every module.

The gather is cut into chunks (at most ``allgather_bucket_size`` elements over all ranks, at least
``_GATHER_PIECES`` per group) and launched without waiting at the end of ``step``; with
``overlap_comm`` it completes lazily, chunk by chunk, in forward pre-hooks of the modules whose
parameters the chunk carries (as DDP's all-reduce overlaps backward), at the latest in
``synchronize`` (``state_dict``, checkpoints, the next step). A separate fp32 master (offload,
bf16/fp16) is copied into the model dtype chunk by chunk just before that chunk goes out.

How a chunk moves is a backend capability (``CommCapabilities``):

* ``p2p_gather`` (gloo, world group): this rank sends its slice of the flat buffer to every peer
  and receives theirs in place. Measured on gloo (world 2, 110 MB) several times faster than
  ``all_gather``, which stages every chunk through a flat temporary of the gathered size.
* ``coalesced_collectives`` (NCCL): one ``all_gather_into_tensor`` per chunk; a chunk that is a
  whole partition is gathered in place into the flat buffer (rank ``r``'s partition already sits at
  ``r * P``), a smaller one through a staging buffer of ``world x chunk`` from the pool, copied
  into the ranks' strided positions when it is waited for.
* otherwise (gloo sub-groups): ``all_gather`` into a list of views of the flat buffer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any

import torch

from ds.interfaces.comm import CommCapabilities
from ds.zero.stages.flat import FlatGroup
from ds.zero.stages.groups import Group
from ds.zero.stages.pool import BufferPool

# The parameter gather is cut into at least this many chunks per group (each at most
# allgather_bucket_size) so the first modules' weights arrive early in the next forward.
_GATHER_PIECES = 8
_MIN_GATHER_CHUNK = 1 << 18


@dataclass(eq=False, repr=False)
class ParamGather:
    groups: list[Group]
    _: KW_ONLY
    comm: Any
    pg: Any
    world: int
    rank: int
    allgather_numel: int
    caps: InitVar[CommCapabilities]
    pool: BufferPool
    timed: Callable[[Callable[[], Any]], Any]
    # In-flight chunks in launch order: (handles, finish after the wait or None).
    in_flight: list[tuple[list[Any], Callable[[], None] | None]] = field(
        default_factory=list, init=False
    )
    _waited: int = field(default=0, init=False)  # how many of them have been waited for

    def __post_init__(self, caps: CommCapabilities) -> None:
        self.p2p = caps.p2p_gather and self.pg is None
        self.coalesced = caps.coalesced_collectives

    def chunks(self, fg: FlatGroup) -> list[tuple[int, int]]:
        part = fg.partition_numel
        size = min(self.allgather_numel, max(_MIN_GATHER_CHUNK, -(-part // _GATHER_PIECES)))
        return [(c0, min(part, c0 + size)) for c0 in range(0, part, size)]

    def launch(self, group: Group) -> None:
        """Gather the updated partitions of ``group``, chunk by chunk, without waiting."""
        comm = self.comm
        fg = group.flat
        part = fg.partition_numel
        # Expert parameters are partitioned over their replica group only (fg's world and rank).
        world, rank = fg.world_size, fg.rank
        pg = group.replica_pg if group.replica_ranks is not None else self.pg
        for c0, c1 in self.chunks(fg):
            own = fg.flat[rank * part + c0 : rank * part + c1]
            if not group.master_is_view:
                # From pinned host memory this is asynchronous on the current stream, which the
                # collectives below are ordered after.
                own.copy_(group.master[c0:c1], non_blocking=group.master.is_pinned())
            if world == 1:
                continue
            if self.p2p and group.replica_ranks is None:
                handles: list[Any] = []
                for r in range(world):
                    if r != rank:
                        handles.append(comm.isend(own, r))
                        handles.append(comm.irecv(fg.flat[r * part + c0 : r * part + c1], r))
                self.in_flight.append((handles, None))
            elif self.coalesced and (c0, c1) == (0, part):
                handle = self.timed(
                    functools.partial(comm.all_gather_into_tensor, fg.flat, own, pg, True)
                )
                self.in_flight.append(([handle], None))
            elif self.coalesced:
                staging = self.pool.take(world * (c1 - c0), fg.flat.device, fg.dtype)
                handle = self.timed(
                    functools.partial(comm.all_gather_into_tensor, staging, own, pg, True)
                )
                self.in_flight.append(
                    ([handle], functools.partial(self._unstage, fg, c0, c1, staging))
                )
            else:
                outs = [fg.flat[r * part + c0 : r * part + c1] for r in range(world)]
                mine = self.pool.take(c1 - c0, fg.flat.device, fg.dtype)
                mine.copy_(own)
                handle = self.timed(functools.partial(comm.all_gather, outs, mine, pg, True))
                self.in_flight.append(([handle], functools.partial(self.pool.give, mine)))

    def _unstage(self, fg: FlatGroup, c0: int, c1: int, staging: torch.Tensor) -> None:
        part = fg.partition_numel
        fg.flat.view(fg.world_size, part)[:, c0:c1].copy_(staging.view(fg.world_size, c1 - c0))
        self.pool.give(staging)

    def wait(self, upto: int) -> None:
        """Complete the in-flight chunks with index < ``upto`` (launch order)."""
        while self._waited < min(upto, len(self.in_flight)):
            handles, finish = self.in_flight[self._waited]
            for handle in handles:
                self.timed(handle.wait)
            if finish is not None:
                finish()
            self._waited += 1
        if self._waited >= len(self.in_flight) and self.in_flight:
            self.in_flight.clear()
            self._waited = 0
            self.pool.clear()

    def synchronize(self) -> None:
        if self.in_flight:
            self.wait(len(self.in_flight))

    def gather_now(self, group: Group) -> None:
        self.launch(group)
        self.synchronize()

    # -- lazy completion -------------------------------------------------------------------------
    def install_hooks(self, root: torch.nn.Module) -> list[Any]:
        """Forward pre-hooks waiting for the chunks that carry each module's parameters, and a
        state_dict pre-hook (reading weights without a forward sees the gathered values)."""
        where: dict[int, int] = {}  # id(param) -> 1 + index of the last chunk it needs
        base = 0
        for group in self.groups:
            fg = group.flat
            part = fg.partition_numel
            chunks = self.chunks(fg)
            for pi, p in enumerate(fg.params):
                start, stop = fg.offsets[pi], fg.offsets[pi] + p.numel()
                need = 0
                for k, (c0, c1) in enumerate(chunks):
                    for r in range(fg.world_size):
                        if start < r * part + c1 and r * part + c0 < stop:
                            need = max(need, base + k + 1)
                where[id(p)] = need
            base += len(chunks)
        hooks: list[Any] = []
        for module in root.modules():
            needs = [where[id(p)] for p in module.parameters(recurse=False) if id(p) in where]
            if needs:
                hook = functools.partial(self._before_forward, max(needs))
                hooks.append(module.register_forward_pre_hook(hook))
        hooks.append(root.register_state_dict_pre_hook(self._before_state_dict))  # type: ignore[no-untyped-call]
        return hooks

    def _before_forward(self, upto: int, module: torch.nn.Module, args: Any) -> None:
        if self.in_flight:
            self.wait(upto)

    def _before_state_dict(self, module: torch.nn.Module, prefix: str, keep_vars: bool) -> None:
        self.synchronize()
