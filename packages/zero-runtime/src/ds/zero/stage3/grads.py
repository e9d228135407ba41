"""Stage-3 gradient reduction: asynchronous per-parameter reductions overlapped with the rest
of backward, landing in fp32 tensors that hold this rank's gradient partitions.

Each partition lands in its own tensor from the C heap: by the end of backward most activations
are freed, and their heap memory takes the gradients without new pages (a separate mapping for
all partitions made every landing page-fault, about 13k faults a step for 27M parameters at
world 2, and kept the freed activations resident beside it).

Gradients are grouped as autograd produces them; a group passes one order check (batched with
the next module fetch's, or on its own once it reaches half ``reduce_bucket_size`` elements)
and then starts one reduction per parameter without waiting. On host tensors over the world
group the reduction is a point-to-point reduce-scatter (each rank sends every peer that peer's
slice and sums what it receives); over a sub-group, an in-place all-reduce of the full gradient
whose partition is read out when it lands (see ``Collectives.all_reduce``); elsewhere a
reduce-scatter that, on the first backward of a step, writes straight into the partition's
tensor. Either way nothing is bucketed or copied on the way out (a padded copy only when the parameter's size is
not a multiple of the world size). Gradients held by groups and reductions in flight stay
within about ``reduce_bucket_size`` elements; ``finish`` (end of backward) waits for the rest.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.comm import ReduceOp
from ds.zero.stage3.collectives import Collectives, p2p_tag
from ds.zero.stage3.pool import BufferPool
from ds.zero.stage3.shard import ShardState


@dataclass
class _Flight:
    s: ShardState
    work: Any
    inp: torch.Tensor  # the full (padded) gradient being reduced
    out: torch.Tensor  # this rank's reduced partition (sum over ranks)
    first: bool  # ``out`` is a fresh tensor this rank owns: it can become the partition


class _PeerSum:
    """Point-to-point reduce-scatter in flight: ``wait()`` completes the transfers and sums
    this rank's slice and the peers' contributions (in rank order) into the first receive
    buffer, which it returns; the other receive buffers go back to the pool."""

    def __init__(
        self, works: list[Any], out: torch.Tensor, recvs: list[torch.Tensor], pool: BufferPool
    ) -> None:
        self.works, self.out, self.recvs, self.pool = works, out, recvs, pool

    def wait(self) -> torch.Tensor:
        while self.works:
            self.works.pop().wait()
        if not self.recvs:  # a world of one: the slice is the sum
            return self.out
        # The sum lands in a receive buffer rather than in the full gradient's slice: that
        # buffer then becomes the partition, with no further allocation or copy, while the
        # full gradient goes back whole. (Addition commutes exactly: the same bits.)
        total = self.recvs[0].add_(self.out)
        for i in range(1, len(self.recvs)):
            total.add_(self.recvs[i])
        ptrs = [t.data_ptr() for t in self.recvs[1:]]
        # No reference may survive here (a loop variable would): the pool reuses a buffer only
        # once nothing else holds it.
        self.recvs = []
        self.out = total
        for ptr in ptrs:
            self.pool.give(ptr, settle_s=0.002)
        return total


class GradReducer:
    def __init__(
        self,
        coll: Collectives,
        pool: BufferPool,
        bucket_numel: int,
    ) -> None:
        self.coll = coll
        self.pool = pool
        self.world = coll.world
        self.half = max(1, bucket_numel // 2)
        self._group: list[tuple[ShardState, torch.Tensor]] = []
        self._group_numel = 0
        self._flights: deque[_Flight] = deque()
        self._flight_numel = 0
        self.launched = 0  # order-checked groups
        self.peak_held_numel = 0  # most gradient elements held at once (grouped + in flight)

    @staticmethod
    def _partition(s: ShardState, device: torch.device) -> torch.Tensor:
        return torch.empty(s.shard_numel, dtype=torch.float32, device=device)

    # -- filling -------------------------------------------------------------------------------
    def add(self, s: ShardState, grad: torch.Tensor) -> None:
        """Take a parameter's full gradient (the caller drops its own reference)."""
        self._group.append((s, grad))
        self._group_numel += s.padded_numel
        self.peak_held_numel = max(self.peak_held_numel, self._group_numel + self._flight_numel)
        if self._group_numel >= self.half:
            self.launch()

    @property
    def held_numel(self) -> int:
        """Full-gradient elements held: waiting for a launch or in reduction."""
        return self._group_numel + self._flight_numel

    @property
    def grouped(self) -> list[ShardState]:
        """Parameters whose gradients wait for the next launch."""
        return [s for s, _ in self._group]

    def launch(self, checked: bool = False) -> None:
        """Check the group's order across ranks (unless the caller's check covered it) and
        start its reductions."""
        if not self._group:
            return
        group, self._group, self._group_numel = self._group, [], 0
        if not checked:
            self.coll.context = "gradient reduce-scatter"
            self.coll.start_check("reduce_scatter", [s for s, _ in group])
        self.coll.reduce_scatters += 1
        self.launched += 1
        for s, grad in group:
            self._start(s, grad)
        # Drop this frame's references before landing: a landed gradient's buffer goes back to
        # the pool only when nothing else holds it.
        del group, s, grad
        while self._flight_numel > self.half and self._flights:
            self._land(self._flights.popleft())

    def _start(self, s: ShardState, grad: torch.Tensor) -> None:
        flat = grad.reshape(-1)
        if s.padded_numel != s.numel:
            inp = self.pool.take(s.padded_numel, flat.dtype, flat.device)
            inp[: s.numel].copy_(flat)
            inp[s.numel :].zero_()
        else:
            inp = flat
        first = s.grad is None and flat.dtype == torch.float32
        if self.coll.comm is None:
            out = inp[: s.shard_numel]
            work = None
        elif self.coll.use_all_reduce(inp) and self.coll.group is None:
            # Host memory over the world group: a point-to-point reduce-scatter. Each rank sends
            # every peer that peer's slice and adds what it receives into its own slice in
            # place: a reduce-scatter's bytes (half an all-reduce's) and no full-size temporary.
            n, comm = s.shard_numel, self.coll.comm
            out = inp[s.offset : s.offset + n]
            works: list[Any] = []
            recvs: list[torch.Tensor] = []
            tag = p2p_tag(s, 1)
            for r in range(self.world):
                if r != self.coll.rank:
                    works.append(comm.isend(inp[r * n : (r + 1) * n], r, tag=tag))
                    recvs.append(self.pool.take(n, flat.dtype, flat.device))
                    works.append(comm.irecv(recvs[-1], r, tag=tag))
            work = _PeerSum(works, out, recvs, self.pool)
        elif self.coll.use_all_reduce(inp):
            # In place on the full gradient; this rank's partition is read out when it lands.
            out = inp[s.offset : s.offset + s.shard_numel]
            work = self.coll.comm.all_reduce(
                inp, op=ReduceOp.SUM, group=self.coll.group, async_op=True
            )
            first = False
        else:
            out = (
                self._partition(s, flat.device)
                if first
                else self.pool.take(s.shard_numel, flat.dtype, flat.device)
            )
            work = self.coll.comm.reduce_scatter_tensor(
                out, inp, op=ReduceOp.SUM, group=self.coll.group, async_op=True
            )
        owned = first and self.coll.comm is not None
        if isinstance(work, _PeerSum):
            owned = flat.dtype == torch.float32 and self.world > 1
        self._flights.append(_Flight(s, work, inp, out, owned))
        self._flight_numel += s.padded_numel

    def finish(self) -> None:
        """Reduce what is left and wait for every reduction (end of backward)."""
        self.launch()
        while self._flights:
            self._land(self._flights.popleft())

    # -- accumulating --------------------------------------------------------------------------
    def _land(self, f: _Flight) -> None:
        self.coll.verify()  # the ranks agree on this reduction before it is waited on
        if isinstance(f.work, _PeerSum):
            f.out = f.work.wait()  # a receive buffer from the pool, now holding the sum
        elif f.work is not None:
            f.work.wait()
        f.work = None
        s = f.s
        self._flight_numel -= s.padded_numel
        exact = f.out.untyped_storage().nbytes() == f.out.numel() * f.out.element_size()
        if f.first and s.grad is None and exact:
            s.grad = f.out.div_(self.world)
            if self.pool.owns(f.out):
                self.pool.forget(f.out.data_ptr())  # the partition keeps it
        elif s.grad is None:
            s.grad = torch.div(f.out, self.world, out=self._partition(s, f.out.device))
        else:
            s.grad.add_(f.out / self.world)  # divide first: the same rounding as the first
        ptrs = {t.data_ptr() for t in (f.inp, f.out) if self.pool.owns(t)}
        del f.inp, f.out
        for ptr in ptrs:
            self.pool.give(ptr, settle_s=0.002)
