"""Stage-3 data movement: gathers and reduce-scatters of per-parameter shards, and an optional
cross-rank order check.

Parameters travel in buckets. On the device path (NCCL's rules: every tensor on the
communicator's device) the shards of a bucket are concatenated into one input of ``S`` elements,
gathered with one ``all_gather_into_tensor`` into ``world * S`` elements laid out rank-major, and
each parameter's full tensor is copied out of the ``(world, S)`` view when the gather is waited
on; gradients go the opposite way, one ``reduce_scatter_tensor`` per bucket (see ``grads.py``).
Buckets hold at most ``bucket_numel`` elements (``stage3_prefetch_bucket_size``) and one dtype.

Host tensors on a backend whose capabilities prefer point-to-point exchanges (gloo) take
another route, measured on gloo: in-place point-to-point exchanges over
the world group and in-place all-reduces over a sub-group (gloo's all-gather and reduce-scatter
stage every call through full-size temporaries of their own). No NCCL run ever takes it: NCCL
cannot move host tensors.

Shards may live off the compute device (``offload_param.device="cpu"``): they are copied to
``device`` explicitly, into the bucket's input, before the collective.

Order check (debug option ``zero_optimization.stage3_check_module_order``, off by default): every
collective is preceded by a fixed-size all-reduce of a fingerprint of the parameters it moves.
Ranks whose forward/backward visits modules in a different order (dynamic control flow) would
otherwise pair mismatched collectives and hang or corrupt data; with the fingerprint all ranks
detect the divergence at the same collective and raise the same clear error. The probe lives on
the communicator's device and is started without waiting (``start_check``) and verified before
anything waits on the data it covers, and before the next fingerprint starts; verifying reads it
back to the host, a synchronisation the hot path cannot afford, hence off by default.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.comm import Communicator, ReduceOp, comm_capabilities
from ds.interfaces.errors import CommError
from ds.zero.stage3.pool import BufferPool, address
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
    """Stage-3 data movement over a :class:`Communicator` (``None`` means a single rank).

    ``device``: where gathered parameters, gradient buckets and the order probe live (the
    communicator's device); ``None`` uses each shard's own device. ``bucket_numel``: the most
    elements one device-path gather moves."""

    def __init__(
        self,
        comm: Communicator | None,
        group: Any = None,
        check_order: bool = False,
        all_reduce: bool | None = None,
        device: torch.device | str | None = None,
        bucket_numel: int = 50_000_000,
    ) -> None:
        self.comm = comm
        self.group = group
        self.world = 1 if comm is None else comm.get_world_size(group)
        self.rank = 0 if comm is None else comm.get_rank(group)
        self.check_order = check_order and self.world > 1
        self.device = None if device is None else torch.device(device)
        self.bucket_numel = max(1, int(bucket_numel))
        self.context = ""  # what the caller is doing, for the order-error message
        # Full-size buffers for gathered parameters; None allocates fresh ones.
        self.pool: BufferPool | None = None
        # In-place collectives for host tensors (see the module docstring), a gloo choice: taken
        # when the backend's capabilities say point-to-point exchanges beat its all-gather.
        # None: decided per tensor (host tensors on such a backend); True/False forces them.
        self.all_reduce = all_reduce
        self.p2p = comm is None or comm_capabilities(comm, group).p2p_gather
        self.gathers = 0  # gather calls
        self.gathered_params = 0  # parameters those calls moved
        self.collectives = 0  # collectives launched by gathers (buckets or exchanges)
        self.reduce_scatters = 0  # gradient groups reduced
        self.checks = 0  # order-check probes all-reduced
        self._probe: _Probe | None = None  # the fingerprint not yet verified

    def device_of(self, s: ShardState) -> torch.device:
        """Where ``s``'s full parameter lives when gathered."""
        return self.device if self.device is not None else s.shard.device

    # -- order check ---------------------------------------------------------------------------
    def _check(self, kind: str, states: Sequence[ShardState]) -> None:
        """Check at once that every rank is at the same collective."""
        self.start_check(kind, states)
        self.verify()

    def start_check(self, kind: str, states: Sequence[ShardState]) -> None:
        """Start the fingerprint all-reduce for the collective(s) about to move ``states``;
        :meth:`verify` must run before anything waits on their data."""
        if not self.check_order or not states:
            return
        assert self.comm is not None
        self.verify()
        fp = _fingerprint(kind, states)
        n = sum(s.shard_numel for s in states)
        probe = torch.tensor([fp, -fp, n, -n], dtype=torch.int64, device=self.device_of(states[0]))
        work = self.comm.all_reduce(probe, op=ReduceOp.MAX, group=self.group, async_op=True)
        self.checks += 1
        self._probe = _Probe(work, probe, fp, n, kind, list(states), self.context)

    def verify(self) -> None:
        """Wait for the outstanding fingerprint (if any); raise if the ranks disagree."""
        p, self._probe = self._probe, None
        if p is None:
            return
        if p.work is not None:
            p.work.wait()
        got = p.probe.tolist()  # one read-back (debug option only)
        if got[0] == p.fp and got[1] == -p.fp and got[2] == p.n:
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
        self.gathered_params += len(states)
        for s in states:
            s.status = ParamStatus.INFLIGHT
        if self.comm is None:
            return PendingGather(params, None, None, self)
        outs: list[torch.Tensor | None] = [None] * len(states)
        works: list[Any] = []
        buckets: list[_GatherBucket] = []
        device_path: list[int] = []
        for i, s in enumerate(states):
            device = self.device_of(s)
            if not self.use_all_reduce(s.shard, device):
                device_path.append(i)
                continue
            out = self._take(s.padded_numel, s.dtype, device)
            self.collectives += 1
            if self.group is None:
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
            else:
                # Adding zeros is exact, so the sum is every rank's shard, bit for bit.
                out.zero_()
                out[s.offset : s.offset + s.shard_numel].copy_(s.shard)
                works.append(
                    self.comm.all_reduce(out, op=ReduceOp.SUM, group=self.group, async_op=async_op)
                )
            outs[i] = out  # PendingGather.wait() completes the transfers
        for idx in self._buckets(states, device_path):
            buckets.append(self._gather_bucket(states, idx, outs, async_op))
        return PendingGather(params, outs, works, self, buckets)

    def _buckets(self, states: Sequence[ShardState], idx: list[int]) -> list[list[int]]:
        """Split ``idx`` into buckets of one dtype and device, at most ``bucket_numel`` each."""
        out: list[list[int]] = []
        open_: dict[tuple[torch.dtype, torch.device], tuple[list[int], list[int]]] = {}
        for i in idx:
            s = states[i]
            key = (s.dtype, self.device_of(s))
            cur, size = open_.get(key, ([], [0]))
            if cur and size[0] + s.padded_numel > self.bucket_numel:
                out.append(cur)
                cur, size = [], [0]
            cur.append(i)
            size[0] += s.padded_numel
            open_[key] = (cur, size)
        out.extend(cur for cur, _ in open_.values() if cur)
        return out

    def _gather_bucket(
        self,
        states: Sequence[ShardState],
        idx: list[int],
        outs: list[torch.Tensor | None],
        async_op: bool,
    ) -> _GatherBucket:
        assert self.comm is not None
        first = states[idx[0]]
        dtype, device = first.dtype, self.device_of(first)
        self.collectives += 1
        if len(idx) == 1:
            # One parameter: gathered straight into the buffer that becomes the parameter.
            out = self._take(first.padded_numel, dtype, device)
            work = self.comm.all_gather_into_tensor(
                out, _on(first.shard, device), group=self.group, async_op=async_op
            )
            outs[idx[0]] = out
            return _GatherBucket(work, idx, [], None, None, 0)
        total = sum(states[i].shard_numel for i in idx)
        inp = self._take(total, dtype, device)
        offsets, off = [], 0
        for i in idx:
            n = states[i].shard_numel
            inp[off : off + n].copy_(states[i].shard, non_blocking=True)  # host -> device too
            offsets.append(off)
            off += n
        staged = self._take(self.world * total, dtype, device)
        work = self.comm.all_gather_into_tensor(staged, inp, group=self.group, async_op=async_op)
        return _GatherBucket(work, idx, offsets, inp, staged, total)

    def use_all_reduce(self, t: torch.Tensor, device: torch.device | None = None) -> bool:
        """Whether ``t`` (to be moved on ``device``) takes the host-tensor route."""
        if self.all_reduce is None:
            return self.p2p and (device or t.device).type == "cpu"
        return self.all_reduce

    def _take(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if self.pool is None:
            return torch.empty(numel, dtype=dtype, device=device)
        return self.pool.take(numel, dtype, device)

    def _give(self, t: torch.Tensor | None) -> None:
        if self.pool is not None and t is not None and t.numel():
            self.pool.give(address(t))

    def release_param(self, p: torch.nn.Parameter) -> None:
        """Drop a gathered parameter's full data, handing its buffer back to the pool."""
        s = shard_of(p)
        ptr = address(p.data) if p.data.numel() else 0
        p.data = torch.empty(0, dtype=s.dtype, device=self.device_of(s))
        s.status = ParamStatus.NOT_AVAILABLE
        if self.pool is not None and ptr:
            self.pool.give(ptr)

    # -- gradients -----------------------------------------------------------------------------
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.comm is not None:
            self.comm.all_reduce(t, op=ReduceOp.SUM, group=self.group)
        return t


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``: an explicit copy when it lives elsewhere (an offloaded shard)."""
    return t if t.device == device else t.to(device, non_blocking=True)


@dataclass
class _GatherBucket:
    """One device-path all-gather: ``idx`` are positions in the gather's parameter list; with
    ``staged`` set, their shards were concatenated at ``offsets`` and are cut out on wait."""

    work: Any
    idx: list[int]
    offsets: list[int]
    inp: torch.Tensor | None
    staged: torch.Tensor | None
    total: int


class PendingGather:
    """A gather in flight. ``wait()`` installs every parameter's full data exactly once."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        outs: list[torch.Tensor | None] | None,
        works: list[Any] | None,
        coll: Collectives,
        buckets: list[_GatherBucket] | None = None,
    ) -> None:
        self.coll = coll
        self.params = list(params)
        self.states = [shard_of(p) for p in params]
        self.outs = outs
        self.works = works
        self.buckets = buckets or []
        self.done = False
        # Single rank: the shard is the whole tensor; hold it now (an NVMe-swapped shard is
        # dropped from the state right after the gather is issued).
        self.local = (
            [_on(t.shard, coll.device_of(t)) for t in self.states] if outs is None else None
        )
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
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
            b.work = None
            if b.staged is None:
                continue
            rows = b.staged.view(self.coll.world, b.total)
            for i, off in zip(b.idx, b.offsets):
                s = self.states[i]
                full = self.coll._take(s.padded_numel, s.dtype, rows.device)
                full.view(self.coll.world, s.shard_numel).copy_(rows[:, off : off + s.shard_numel])
                assert self.outs is not None
                self.outs[i] = full
            del rows
            self.coll._give(b.inp)
            self.coll._give(b.staged)
            b.inp = b.staged = None
        self.buckets = []
        fulls = self.local if self.local is not None else self.outs
        assert fulls is not None
        for s, p, t in zip(self.states, self.params, fulls):
            assert t is not None
            s.pending = None
            s.status = ParamStatus.AVAILABLE
            # The gathered buffer itself becomes the parameter; release hands it back.
            p.data = t[: s.numel].view(s.shape)
        self.outs = None
        self.local = None
