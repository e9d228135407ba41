"""Coalesced gathers and reduce-scatters of per-parameter shards, with a cross-rank order check.

Several parameters travel in one collective: their shards are concatenated into one input of
``S`` elements, gathered into ``world * S`` elements laid out rank-major, and each parameter's
full tensor is cut out of the ``(world, S)`` view. Gradients go the opposite way.

Every collective is preceded by a fixed-size all-reduce of a fingerprint of the parameters it
moves. Ranks whose forward/backward visits modules in a different order (dynamic control flow)
would otherwise pair mismatched collectives and hang or corrupt data; with the fingerprint all
ranks detect the divergence at the same collective and raise the same clear error.

The fingerprint all-reduce is started without waiting (``start_check``) and verified before
anything waits on the data it covers, and before the next fingerprint starts. Waiting on it at
once made every prefetch a synchronising round trip between ranks; verified late, it costs no
waiting beyond what the data needs anyway. At most one fingerprint is unverified at a time, so
ranks that diverge stop at the same one: none has started a later collective that the other
would pair wrongly.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.comm import Communicator, ReduceOp
from ds.interfaces.errors import CommError
from ds.zero.stage3.pool import BufferPool
from ds.zero.stage3.shard import ParamStatus, ShardState, shard_of


class ModuleOrderError(CommError):
    """Ranks reached different stage-3 collectives: they ran modules in different orders."""


def p2p_tag(s: ShardState, kind: int) -> int:
    """Tag of a parameter's point-to-point exchange (``kind`` 0: gather, 1: gradient).

    Ranks that diverge exchange different parameters under different tags, so gloo never pairs a
    send with a receive of another size (it aborts the process on such a mismatch) and the order
    check reports the divergence instead."""
    return (2 * s.ds_id + kind) % (1 << 30)


def _fingerprint(kind: str, states: Sequence[ShardState]) -> int:
    ids = ",".join(str(s.ds_id) for s in states)
    return zlib.crc32(f"{kind}:{ids}".encode())


@dataclass
class _Probe:
    """A fingerprint all-reduce in flight and what it covers (for the error message)."""

    work: Any
    probe: torch.Tensor
    fp: int
    n: int
    kind: str
    states: Sequence[ShardState]
    context: str


class Collectives:
    """Stage-3 data movement over a :class:`Communicator` (``None`` means a single rank)."""

    def __init__(
        self,
        comm: Communicator | None,
        group: Any = None,
        check_order: bool = True,
        all_reduce: bool | None = None,
    ) -> None:
        self.comm = comm
        self.group = group
        self.world = 1 if comm is None else comm.get_world_size(group)
        self.rank = 0 if comm is None else comm.get_rank(group)
        self.check_order = check_order and self.world > 1
        self.context = ""  # what the caller is doing, for the order-error message
        # Full-size buffers for gathered parameters; None allocates fresh ones.
        self.pool: BufferPool | None = None
        # In-place collectives: over the world group, point-to-point exchanges (gather: every
        # rank sends its shard to each peer; gradients: every rank sends each peer its slice and
        # adds what it receives); over a sub-group, all-reduce of a zeroed full buffer holding
        # the shard, and in-place all-reduce of gradients. All run in the caller's buffer; gloo's
        # all-gather and reduce-scatter stage every call through full-size temporaries of their
        # own. None: decided per tensor (host tensors use them).
        self.all_reduce = all_reduce
        self.gathers = 0
        self.reduce_scatters = 0
        self._probe: _Probe | None = None  # the fingerprint not yet verified

    # -- order check ---------------------------------------------------------------------------
    def _check(self, kind: str, states: Sequence[ShardState]) -> None:
        """Check at once that every rank is at the same collective."""
        self.start_check(kind, states)
        self.verify()

    def start_check(self, kind: str, states: Sequence[ShardState]) -> None:
        """Start the fingerprint all-reduce for the collective(s) about to move ``states``;
        :meth:`verify` must run before anything waits on their data."""
        if not self.check_order:
            return
        assert self.comm is not None
        self.verify()
        fp = _fingerprint(kind, states)
        n = sum(s.shard_numel for s in states)
        probe = torch.tensor([fp, -fp, n, -n], dtype=torch.int64)
        work = self.comm.all_reduce(probe, op=ReduceOp.MAX, group=self.group, async_op=True)
        self._probe = _Probe(work, probe, fp, n, kind, list(states), self.context)

    def verify(self) -> None:
        """Wait for the outstanding fingerprint (if any); raise if the ranks disagree."""
        p, self._probe = self._probe, None
        if p is None:
            return
        if p.work is not None:
            p.work.wait()
        got = p.probe
        if int(got[0]) == p.fp and int(got[1]) == -p.fp and int(got[2]) == p.n:
            return
        assert self.comm is not None
        mine = f"{p.kind} of [{', '.join(s.name or f'#{s.ds_id}' for s in p.states)}]"
        if p.context:
            mine += f" in {p.context}"
        views: list[Any] = [None] * self.world
        try:
            self.comm.all_gather_object(views, mine, group=self.group)
        except Exception:  # the peers' views are a courtesy; the error below is the point
            views = [mine if r == self.rank else "(unavailable)" for r in range(self.world)]
        lines = "; ".join(f"rank {r}: {v}" for r, v in enumerate(views))
        raise ModuleOrderError(
            "ZeRO stage 3: ranks disagree on the order of parameter collectives "
            f"({lines}). Every rank must run the same modules in the same order; make control "
            "flow depend only on data identical across ranks (for example broadcast the branch "
            "decision from rank 0), or call modules with data-dependent branches outside stage 3"
        )

    # -- gathers -------------------------------------------------------------------------------
    def gather(
        self, params: Sequence[torch.nn.Parameter], async_op: bool = False, checked: bool = False
    ) -> PendingGather:
        """Start gathering the full data of ``params``; ``wait()`` on the result installs it.
        ``checked``: the caller already ran the order check covering this gather."""
        states = [shard_of(p) for p in params]
        if not checked:
            self._check("gather", states)
        self.gathers += 1
        for s in states:
            s.status = ParamStatus.INFLIGHT
        if self.comm is None:
            return PendingGather(params, None, None, self)
        # One collective per parameter, each straight into the buffer that becomes the
        # parameter: no staging buffer and no copy out of a rank-major layout. The order check
        # above covers the whole batch.
        outs, works = [], []
        for s in states:
            out = self._take(s.padded_numel, s.dtype, s.shard.device)
            if self.use_all_reduce(out) and self.group is None:
                # Host memory over the world group: exchange the shards point to point in place.
                # Same bytes as an all-gather, half an all-reduce's, and, unlike gloo's
                # all-gather, no full-size staging temporary.
                n = s.shard_numel
                mine = out[s.offset : s.offset + n]
                mine.copy_(s.shard)
                tag = p2p_tag(s, 0)
                for r in range(self.world):
                    if r != self.rank:
                        works.append(self.comm.isend(mine, r, tag=tag))
                        works.append(self.comm.irecv(out[r * n : (r + 1) * n], r, tag=tag))
                outs.append(out)  # PendingGather.wait() completes the transfers
                continue
            if self.use_all_reduce(out):
                # Adding zeros is exact, so the sum is every rank's shard, bit for bit.
                out.zero_()
                out[s.offset : s.offset + s.shard_numel].copy_(s.shard)
                work = self.comm.all_reduce(
                    out, op=ReduceOp.SUM, group=self.group, async_op=async_op
                )
            else:
                work = self.comm.all_gather_into_tensor(
                    out, s.shard, group=self.group, async_op=async_op
                )
            works.append(work)
            outs.append(out)
        return PendingGather(params, outs, works, self)

    def use_all_reduce(self, t: torch.Tensor) -> bool:
        if self.all_reduce is None:
            return t.device.type == "cpu"
        return self.all_reduce

    def _take(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if self.pool is None:
            return torch.empty(numel, dtype=dtype, device=device)
        return self.pool.take(numel, dtype, device)

    def release_param(self, p: torch.nn.Parameter) -> None:
        """Drop a gathered parameter's full data, handing its buffer back to the pool."""
        s = shard_of(p)
        ptr = p.data.data_ptr() if p.data.numel() else 0
        p.data = torch.empty(0, dtype=s.dtype, device=s.shard.device)
        s.status = ParamStatus.NOT_AVAILABLE
        if self.pool is not None and ptr:
            self.pool.give(ptr)

    # -- gradients -----------------------------------------------------------------------------
    def reduce_scatter(
        self, states: Sequence[ShardState], grads: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Average full padded flat ``grads`` across ranks; return this rank's partition of each."""
        self._check("reduce_scatter", states)
        self.reduce_scatters += 1
        if self.comm is None:
            return [g for g in grads]
        world = self.world
        if len(states) == 1:
            g = grads[0]
            out = torch.empty(states[0].shard_numel, dtype=g.dtype, device=g.device)
            self.comm.reduce_scatter_tensor(out, g, op=ReduceOp.SUM, group=self.group)
            return [out.div_(world)]
        total = sum(s.shard_numel for s in states)
        inp = torch.empty(world, total, dtype=grads[0].dtype, device=grads[0].device)
        off = 0
        for s, g in zip(states, grads):
            inp[:, off : off + s.shard_numel].copy_(g.view(world, s.shard_numel))
            off += s.shard_numel
        out = torch.empty(total, dtype=inp.dtype, device=inp.device)
        self.comm.reduce_scatter_tensor(out, inp.view(-1), op=ReduceOp.SUM, group=self.group)
        out.div_(world)
        parts: list[torch.Tensor] = []
        off = 0
        for s in states:
            parts.append(out[off : off + s.shard_numel])
            off += s.shard_numel
        return parts

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.comm is not None:
            self.comm.all_reduce(t, op=ReduceOp.SUM, group=self.group)
        return t


class PendingGather:
    """A gather in flight. ``wait()`` installs every parameter's full data exactly once."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        outs: list[torch.Tensor] | None,
        works: list[Any] | None,
        coll: Collectives,
    ) -> None:
        self.coll = coll
        self.params = list(params)
        self.states = [shard_of(p) for p in params]
        self.outs = outs
        self.works = works
        self.done = False
        # Single rank: the shard is the whole tensor; hold it now (an NVMe-swapped shard is
        # dropped from the state right after the gather is issued).
        self.local = [t.shard for t in self.states] if outs is None else None
        for s in self.states:
            s.pending = self

    def wait(self) -> None:
        if self.done:
            return
        self.done = True
        self.coll.verify()  # ranks are known to agree before this waits on their data
        for w in self.works or ():
            if w is not None:
                w.wait()
        self.works = None  # work objects reference the buffers: let them go
        fulls = self.local if self.local is not None else self.outs
        assert fulls is not None
        for s, p, t in zip(self.states, self.params, fulls):
            s.pending = None
            s.status = ParamStatus.AVAILABLE
            # The gathered buffer itself becomes the parameter; release hands it back.
            p.data = t[: s.numel].view(s.shape)
        self.outs = None
        self.local = None
