"""Stage-3 gradient reduction: asynchronous reductions overlapped with the rest of backward,
landing in fp32 tensors that hold this rank's gradient partitions.

Gradients are grouped as autograd produces them; a group is launched (after the optional order
check, batched with the next module fetch's) once it reaches half ``reduce_bucket_size``
elements, and the reductions in flight stay within about ``reduce_bucket_size`` elements;
``finish`` (end of backward) waits for the rest.

Device tensors (NCCL's rules): a group is one ``reduce_scatter_tensor`` per dtype: the
gradients are packed rank-major into one ``(world, S)`` input, reduced, and each parameter's
partition is cut out of the ``S`` elements this rank receives.

Host tensors (gloo, measured there): over the world group a point-to-point reduce-scatter per
parameter (each rank sends every peer that peer's slice and sums what it receives, in place);
over a sub-group an in-place all-reduce of the full gradient whose partition is read out when it
lands. Each partition lands in its own tensor from the C heap: by the end of backward most
activations are freed, and their heap memory takes the gradients without new pages (a separate
mapping for all partitions made every landing page-fault, about 13k faults a step for 27M
parameters at world 2).

While ``deferring`` (the engine's coalesced reduction), gradients are held whole and summed per
parameter instead; :meth:`GradReducer.reduce_held` then reduces each sum once, which is what
reducing every backward's gradient and adding the partitions computes (up to rounding order).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.comm import ReduceOp
from ds.zero.stage3.collectives import Collectives, p2p_tag
from ds.zero.stage3.pool import BufferPool, address
from ds.zero.stage3.shard import ShardState


@dataclass
class _Flight:
    s: ShardState
    work: Any
    inp: torch.Tensor  # the full (padded) gradient being reduced
    out: torch.Tensor  # this rank's reduced partition (sum over ranks)
    first: bool  # ``out`` is a fresh tensor this rank owns: it can become the partition


@dataclass
class _Bucket:
    """One device-path reduce-scatter of several gradients: ``out`` holds this rank's summed
    partitions at ``offsets``."""

    states: list[ShardState]
    offsets: list[int]
    work: Any
    inp: torch.Tensor
    out: torch.Tensor
    numel: int  # full padded elements the bucket holds


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
        ptrs = [address(t) for t in self.recvs[1:]]
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
        self._flights: deque[_Flight | _Bucket] = deque()
        self._flight_numel = 0
        self.launched = 0  # order-checked groups
        self.reduced = 0  # gradients reduced
        self.collectives = 0  # reductions launched (one per bucket, or per host parameter)
        self.peak_held_numel = 0  # most gradient elements held at once (grouped + in flight)
        self.deferring = False
        # id(shard state) -> (state, the sum of its full gradients since the last reduction)
        self._held: dict[int, tuple[ShardState, torch.Tensor]] = {}

    @staticmethod
    def _partition(s: ShardState, device: torch.device) -> torch.Tensor:
        return torch.empty(s.shard_numel, dtype=torch.float32, device=device)

    # -- filling -------------------------------------------------------------------------------
    def add(self, s: ShardState, grad: torch.Tensor) -> None:
        """Take a parameter's full gradient (the caller drops its own reference)."""
        if self.deferring:
            self._hold(s, grad)
            return
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
        self._start_group(group)
        # Drop this frame's references before landing: a landed gradient's buffer goes back to
        # the pool only when nothing else holds it.
        del group
        while self._flight_numel > self.half and self._flights:
            self._land(self._flights.popleft())

    def _start(self, s: ShardState, grad: torch.Tensor) -> None:
        self.reduced += 1
        self.collectives += 1
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

    def _start_group(self, group: list[tuple[ShardState, torch.Tensor]]) -> None:
        packed: dict[tuple[torch.dtype, torch.device], list[tuple[ShardState, torch.Tensor]]] = {}
        for s, grad in group:
            if self.coll.comm is None or self.coll.use_all_reduce(grad):
                self._start(s, grad)
            else:
                packed.setdefault((grad.dtype, grad.device), []).append((s, grad))
        for items in packed.values():
            if len(items) == 1:
                self._start(*items[0])
            else:
                self._start_bucket(items)

    def _start_bucket(self, items: list[tuple[ShardState, torch.Tensor]]) -> None:
        """One reduce-scatter for several gradients of one dtype on the device."""
        assert self.coll.comm is not None
        self.reduced += len(items)
        self.collectives += 1
        world = self.world
        dtype, device = items[0][1].dtype, items[0][1].device
        total = sum(s.shard_numel for s, _ in items)
        inp = self.pool.take(world * total, dtype, device)
        rows = inp.view(world, total)
        offsets, off = [], 0
        for s, grad in items:
            n = s.shard_numel
            flat = grad.reshape(-1)
            dst = rows[:, off : off + n]
            if s.padded_numel == s.numel:
                dst.copy_(flat.view(world, n))
            else:
                # The padded tail: rank-major rows that the parameter fills only partly.
                full_rows = s.numel // n
                if full_rows:
                    dst[:full_rows].copy_(flat[: full_rows * n].view(full_rows, n))
                rest = s.numel - full_rows * n
                dst[full_rows, :rest].copy_(flat[full_rows * n :])
                dst[full_rows, rest:].zero_()
                dst[full_rows + 1 :].zero_()
            offsets.append(off)
            off += n
        # The packed copy is what gets reduced: the gradients themselves (pooled buffers the
        # linear backward computed into) go back now, or every step would keep its weight
        # gradients alive in the pool's hand-out table.
        given = [address(grad) for _, grad in items if self.pool.owns(grad)]
        del rows, dst, flat, grad
        for ptr in given:
            self.pool.give(ptr)
        out = self.pool.take(total, dtype, device)
        work = self.coll.comm.reduce_scatter_tensor(
            out, inp, op=ReduceOp.SUM, group=self.coll.group, async_op=True
        )
        numel = world * total
        self._flights.append(_Bucket([s for s, _ in items], offsets, work, inp, out, numel))
        self._flight_numel += numel

    def finish(self) -> None:
        """Reduce what is left and wait for every reduction (end of backward)."""
        self.launch()
        while self._flights:
            self._land(self._flights.popleft())

    # -- deferring ------------------------------------------------------------------------------
    def _hold(self, s: ShardState, grad: torch.Tensor) -> None:
        held = self._held.get(id(s))
        if held is None:
            if self.pool.owns(grad):
                self.pool.forget(address(grad))  # the held sum keeps the pooled buffer
            self._held[id(s)] = (s, grad)
            return
        held[1].add_(grad)
        if self.pool.owns(grad):
            self.pool.give(address(grad))  # shelved once the caller lets go of it

    def reduce_held(self) -> None:
        """Reduce the held sums (in the order their parameters first got a gradient, the same
        on every rank) and wait for them."""
        self.deferring = False
        for key in list(self._held):
            s, grad = self._held.pop(key)
            self.add(s, grad)
            del grad  # the reduction holds it now (a landed buffer returns only when unreferenced)
        self.finish()

    def drop_held(self) -> None:
        """Forget the gradients not yet in a partition (``zero_grad``): the held sums and the
        group a backward cut short by an exception left unlaunched. Reductions already started
        land first (every rank waits on them); the caller then clears the partitions."""
        self._held.clear()
        group, self._group, self._group_numel = self._group, [], 0
        for _, grad in group:
            if self.pool.owns(grad):
                self.pool.give(address(grad))  # shelved once ``group`` lets go of it
        del group
        while self._flights:
            self._land(self._flights.popleft())

    # -- accumulating --------------------------------------------------------------------------
    def _land(self, f: _Flight | _Bucket) -> None:
        self.coll.verify()  # the ranks agree on this reduction before it is waited on
        if isinstance(f, _Bucket):
            self._land_bucket(f)
            return
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
                self.pool.forget(address(f.out))  # the partition keeps it
        elif s.grad is None:
            s.grad = torch.div(f.out, self.world, out=self._partition(s, f.out.device))
        else:
            s.grad.add_(f.out / self.world)  # divide first: the same rounding as the first
        ptrs = {address(t) for t in (f.inp, f.out) if self.pool.owns(t)}
        del f.inp, f.out
        for ptr in ptrs:
            self.pool.give(ptr, settle_s=0.002)

    def _land_bucket(self, b: _Bucket) -> None:
        if b.work is not None:
            b.work.wait()
        b.work = None
        self._flight_numel -= b.numel
        for s, off in zip(b.states, b.offsets):
            part = b.out[off : off + s.shard_numel]
            if s.grad is None:
                s.grad = torch.div(part, self.world, out=self._partition(s, part.device))
            else:
                s.grad.add_(part / self.world)  # divide first: the same rounding as the first
        del part
        ptrs = [address(b.inp), address(b.out)]
        b.inp = b.out = None  # type: ignore[assignment]
        for ptr in ptrs:
            self.pool.give(ptr, settle_s=0.002)
