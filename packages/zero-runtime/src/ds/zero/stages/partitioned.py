"""ZeRO stages 0, 1 and 2 over flat, padded parameter buffers.

* Stage 0: gradients live in one flat buffer (``param.grad`` are views into it) and are all-reduced
  in buckets; every rank steps the whole model.
* Stage 1: as stage 0, but each rank keeps optimizer state (and fp32 master weights) only for its
  partition, steps it, and the updated partitions are all-gathered into the module's weights.
* Stage 2: as stage 1, but gradients are not kept whole: as backward produces them they are copied
  into bucket buffers and reduced to the rank owning each piece, which accumulates it into its
  contiguous partition gradient buffer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ds.interfaces.checkpoint import (
    LoadRequest,
    ShardedStateDict,
    ShardedTensor,
    TensorMeta,
)
from ds.interfaces.comm import ReduceOp
from ds.zero.stages.base import MemoryReport, StrategyContext, ZeroStrategy
from ds.zero.stages.flat import FlatGroup, build_buckets


@dataclass
class _Bucket:
    start: int
    stop: int
    indices: list[int]
    pending: int = 0
    launched: bool = False
    buffer: torch.Tensor | None = None  # stage 2: the bucket's gradients (fp32)
    filled: list[int] = field(default_factory=list)  # stage 2: parameters copied into buffer


@dataclass
class _Group:
    flat: FlatGroup
    lo: int  # range of the flat buffer this rank's optimizer steps
    hi: int
    master: torch.Tensor  # fp32, hi - lo elements (a view of flat.flat when it can be)
    master_grad: torch.Tensor  # fp32, hi - lo elements
    master_is_view: bool
    flat_grad: torch.Tensor | None  # stages 0-1: model-dtype gradients of the whole group
    buckets: list[_Bucket] = field(default_factory=list)
    bucket_of: dict[int, int] = field(default_factory=dict)


class PartitionedStrategy(ZeroStrategy):
    stage = 0

    def __init__(self, ctx: StrategyContext) -> None:
        super().__init__(ctx)
        cfg = ctx.config
        self.world = ctx.world_size
        self.rank = ctx.rank
        self.comm = ctx.comm if self.world > 1 else None
        self.overlap = cfg.zero.overlap
        # Measured on gloo with two ranks: one all-reduce of a bucket costs less than reducing
        # its pieces to their owners (gloo's reduce moves half the bytes at under half the rate),
        # so at that size every stage all-reduces; larger worlds reduce to the owners.
        self.reduce_to_owner = (
            bool(cfg.zero.reduce_scatter) and self.stage >= 1 and self.world > _ALL_REDUCE_WORLD
        )
        self.offload = cfg.zero.offload_optimizer_device == "cpu"
        off = cfg.zero.offload_optimizer
        self.pin = self.offload and off is not None and off.pin_memory
        self.allgather_numel = max(1, cfg.allgather_bucket_size // max(self.world, 1))
        bucket_numel = max(1, cfg.reduce_bucket_size)
        # Gradient averaging: multiply by ``pre`` before the sum over ranks and by ``post`` after
        # (prescale_gradients: 1/world before; gradient_predivide_factor f: 1/f before, f/world
        # after). The reduction runs in ``communication_data_type`` when set, accumulating into
        # the fp32 partition (stage 2) or the gradient buffer (stages 0-1).
        raw = cfg.raw
        factor = float(raw.gradient_predivide_factor)
        if raw.prescale_gradients:
            self._pre, self._post = 1.0 / self.world, 1.0
        else:
            self._pre, self._post = 1.0 / factor, factor / self.world
        if self.comm is None:
            self._pre, self._post = 1.0, 1.0
        self._comm_dtype = _COMM_DTYPES.get(raw.communication_data_type or "")
        self._bucket_dtype: torch.dtype = torch.float32  # stage 2's bucket buffers
        if self.comm is not None and self._comm_dtype is not None:
            self._bucket_dtype = self._comm_dtype
        self._reduce_now = False
        self._pending: list[tuple[Any, Callable[[], None]]] = []
        self._hooks: list[Any] = []
        # Stage-2 bucket buffers reused within one backward, and all-gather chunks within one
        # gather: fresh multi-MB allocations cost page faults comparable to the copies.
        self._pool: dict[int, list[torch.Tensor]] = {}
        # In-flight parameter gather chunks: (handles, staging buffer to recycle or None).
        self._gathers: list[tuple[list[Any], torch.Tensor | None]] = []
        self._gathered = 0  # how many of them have been waited for
        self.groups: list[_Group] = []
        opt_groups: list[dict[str, Any]] = []
        for user_group in ctx.param_groups:
            params = [p for p in user_group["params"] if p.requires_grad]
            names = [ctx.param_names[id(p)] for p in params]
            fg = FlatGroup(params, names, self.world, self.rank)
            group = self._build_group(fg)
            for b, (start, stop, indices) in enumerate(build_buckets(fg, bucket_numel)):
                group.buckets.append(_Bucket(start, stop, indices))
                for i in indices:
                    group.bucket_of[i] = b
            self.groups.append(group)
            hyper = {k: v for k, v in user_group.items() if k != "params"}
            opt_groups.append({**hyper, "params": [group.master]})
        self._optimizer = ctx.optimizer_factory(opt_groups)
        for gi, group in enumerate(self.groups):
            for pi, p in enumerate(group.flat.params):
                hook = functools.partial(self._on_grad, gi, pi)
                self._hooks.append(p.register_post_accumulate_grad_hook(hook))
        if self.stage >= 1 and self.comm is not None:
            self._install_gather_hooks()

    # -- construction ----------------------------------------------------------------------------
    def _build_group(self, fg: FlatGroup) -> _Group:
        lo, hi = fg.partition_range() if self.stage >= 1 else (0, fg.padded)
        fp32 = fg.dtype == torch.float32
        master_is_view = fp32 and not self.offload
        if master_is_view:
            master = fg.flat[lo:hi]
        else:
            master = fg.flat[lo:hi].detach().to(torch.float32, copy=True)
            if self.offload:
                master = self._host(master)
        flat_grad: torch.Tensor | None = None
        if self.stage <= 1:
            flat_grad = torch.zeros_like(fg.flat)
            for i, p in enumerate(fg.params):
                p.grad = fg.view(flat_grad, i)
        kernels = self.ctx.kernels
        if self.stage <= 1 and master_is_view:
            assert flat_grad is not None
            master_grad = flat_grad[lo:hi]
        elif self.offload and kernels is not None and master.device.type == "cpu":
            # The offloaded step walks the master copy and its grad in lockstep: the provider
            # places the grad apart from it (KernelProvider.new_state).
            master_grad = kernels.new_state(master, (master,))
        else:
            master_grad = torch.zeros(hi - lo, dtype=torch.float32, device=master.device)
        return _Group(fg, lo, hi, master, master_grad, master_is_view, flat_grad)

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the host. With ``offload_optimizer.pin_memory`` and a model on an accelerator
        device that has pinned memory, page-locked, so the chunked copies back to the device run
        asynchronously."""
        acc = self.ctx.accelerator
        pin = (
            self.pin
            and t.device.type != "cpu"
            and acc is not None
            and acc.capabilities().has_pinned_memory
        )
        host = t.cpu()
        return acc.pin_memory(host) if pin and acc is not None else host

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    # -- backward --------------------------------------------------------------------------------
    def begin_micro_step(self, boundary: bool, no_sync: bool = False) -> None:
        if self.stage >= 2:
            self._reduce_now = not no_sync
        else:
            self._reduce_now = boundary and not no_sync
            self._attach_grad_views()
        if self._reduce_now:
            for group in self.groups:
                for bucket in group.buckets:
                    bucket.pending = len(bucket.indices)
                    bucket.launched = False
                    bucket.filled.clear()

    def _attach_grad_views(self) -> None:
        # Someone (module.zero_grad(), a client) may have replaced param.grad; put the flat views
        # back, keeping any gradient already there.
        for group in self.groups:
            assert group.flat_grad is not None
            for i, p in enumerate(group.flat.params):
                view = group.flat.view(group.flat_grad, i)
                grad = p.grad
                if grad is None or grad.data_ptr() != view.data_ptr():
                    if grad is not None:
                        view.copy_(grad)
                    else:
                        view.zero_()
                    p.grad = view

    def _on_grad(self, gi: int, pi: int, param: torch.Tensor) -> None:
        if not self._reduce_now:
            return
        group = self.groups[gi]
        bucket = group.buckets[group.bucket_of[pi]]
        if self.stage >= 2:
            if bucket.buffer is None:
                bucket.buffer = self._take(
                    bucket.stop - bucket.start, group.flat.flat.device, self._bucket_dtype
                )
            bucket.filled.append(pi)
            off = group.flat.offsets[pi] - bucket.start
            assert param.grad is not None
            dst = bucket.buffer[off : off + param.numel()]
            # One pass: cast to the communication dtype and apply the pre-reduction scale.
            if self._pre != 1.0:
                torch.mul(param.grad.reshape(-1), self._pre, out=dst)
            else:
                dst.copy_(param.grad.reshape(-1))
            param.grad = None
        bucket.pending -= 1
        if bucket.pending == 0 and self.overlap:
            self._launch(group, bucket)

    def _launch(self, group: _Group, bucket: _Bucket) -> None:
        bucket.launched = True
        target: torch.Tensor | None = None  # stages 0-1: where the reduced values go back
        if self.stage >= 2:
            if bucket.buffer is None:  # no parameter of the bucket got a gradient
                bucket.buffer = self._take(
                    bucket.stop - bucket.start, group.flat.flat.device, self._bucket_dtype
                )
            self._zero_gaps(group, bucket, bucket.buffer)
            data = bucket.buffer
        else:
            assert group.flat_grad is not None
            data = group.flat_grad[bucket.start : bucket.stop]
            comm_dtype = self._comm_dtype or data.dtype
            if self.comm is not None and comm_dtype != data.dtype:
                # Reduce a copy in the communication dtype; the result is written back in _finish.
                target = data
                data = self._take(data.numel(), data.device, comm_dtype)
                if self._pre != 1.0:
                    torch.mul(target, self._pre, out=data)
                else:
                    data.copy_(target)
            elif self.comm is not None and self._pre != 1.0:
                data.mul_(self._pre)
        finish = functools.partial(self._finish, group, bucket, data, target)
        if self.comm is None:
            self._pending.append((None, finish))
            return
        comm = self.comm
        handles: list[Any] = []
        if self.reduce_to_owner:
            for owner, lo, hi in group.flat.owners(bucket.start, bucket.stop):
                piece = data[lo - bucket.start : hi - bucket.start]
                handles.append(
                    self._timed(
                        functools.partial(
                            comm.reduce, piece, owner, ReduceOp.SUM, self.ctx.group, True
                        )
                    )
                )
        else:
            handles.append(
                self._timed(
                    functools.partial(comm.all_reduce, data, ReduceOp.SUM, self.ctx.group, True)
                )
            )
        for h in handles[:-1]:
            self._pending.append((h, _noop))
        self._pending.append((handles[-1], finish))

    def _finish(
        self, group: _Group, bucket: _Bucket, data: torch.Tensor, target: torch.Tensor | None
    ) -> None:
        post = self._post
        if self.stage >= 2:
            lo, hi = max(bucket.start, group.lo), min(bucket.stop, group.hi)
            if lo < hi:
                piece = data[lo - bucket.start : hi - bucket.start]
                # Accumulated in fp32 whatever dtype the reduction ran in.
                group.master_grad[lo - group.lo : hi - group.lo].add_(piece, alpha=post)
            self._give(data)
            bucket.buffer = None
            return
        if self.world == 1:
            return
        # Stage 1 steps (and norms/clipping read) only the owned piece; stage 0 needs everything.
        lo, hi = bucket.start, bucket.stop
        if self.stage >= 1:
            lo, hi = max(lo, group.lo), min(hi, group.hi)
        if lo < hi:
            piece = data[lo - bucket.start : hi - bucket.start]
            if target is not None:
                torch.mul(piece, post, out=target[lo - bucket.start : hi - bucket.start])
            elif post != 1.0:
                piece.mul_(post)
        if target is not None:
            self._give(data)

    def end_backward(self) -> None:
        if not self._reduce_now:
            return
        for group in self.groups:
            for bucket in group.buckets:
                if not bucket.launched:
                    self._launch(group, bucket)
        pending, self._pending = self._pending, []
        for handle, finish in pending:
            if handle is not None:
                self._timed(handle.wait)
            finish()
        # Buffers are reused within a backward (bucket after bucket) but not kept past it, so
        # the optimizer step's peak does not carry them.
        self._pool.clear()
        if self.stage <= 1:
            for group in self.groups:
                if not group.master_is_view:
                    assert group.flat_grad is not None
                    group.master_grad.copy_(group.flat_grad[group.lo : group.hi])
        self._reduce_now = False

    # -- step ------------------------------------------------------------------------------------
    def local_grad_shards(self) -> Sequence[torch.Tensor]:
        return [g.master_grad for g in self.groups]

    def step(self) -> None:
        # The optimizer writes the partitions the previous all-gather reads and fills.
        self.synchronize_parameters()
        for group in self.groups:
            group.master.grad = group.master_grad
        self._optimizer.step()
        for group in self.groups:
            group.master.grad = None
            if self.stage >= 1 and self.comm is not None:
                self._launch_gather(group)
            elif not group.master_is_view:
                group.flat.flat[group.lo : group.hi].copy_(group.master)
        # Without overlap_comm the module's weights are whole when step() returns, so code that
        # reads them directly (EMA copies, submodule state_dicts) needs no synchronisation.
        if not self.overlap:
            self.synchronize_parameters()

    # -- parameter all-gather (stages 1-2) -------------------------------------------------------
    # With overlap_comm, the gather of the updated partitions is launched asynchronously at the end
    # of ``step`` and completed lazily: chunk by chunk in forward pre-hooks of the modules whose parameters the
    # chunk carries (so the gather overlaps the next forward, as DDP's all-reduce overlaps
    # backward), at the latest by ``synchronize_parameters`` (state_dict, checkpoints, step).
    def _gather_chunks(self, fg: FlatGroup) -> list[tuple[int, int]]:
        part = fg.partition_numel
        size = min(self.allgather_numel, max(_MIN_GATHER_CHUNK, -(-part // _GATHER_PIECES)))
        return [(c0, min(part, c0 + size)) for c0 in range(0, part, size)]

    def _launch_gather(self, group: _Group) -> None:
        """Gather the updated partitions, chunk by chunk, without waiting.

        Over the world group each chunk is exchanged point to point: this rank sends its slice of
        the module's flat buffer to every peer and receives theirs in place. Measured on gloo
        (world 2, 110 MB) that is several times faster than ``all_gather``, which stages every
        chunk through a flat temporary of the gathered size and copies it out again (and,
        launched ahead for the lazy waits, would hold all those temporaries at once). A separate
        fp32 master (offload, bf16/fp16) is copied into the model dtype chunk by chunk just before
        that chunk is sent, so each copy overlaps the previous chunk's transfer."""
        assert self.comm is not None
        comm = self.comm
        fg = group.flat
        part = fg.partition_numel
        p2p = self.ctx.group is None
        for c0, c1 in self._gather_chunks(fg):
            own = fg.flat[self.rank * part + c0 : self.rank * part + c1]
            if not group.master_is_view:
                # From pinned host memory this is asynchronous on the current stream, which the
                # collectives below are ordered after.
                own.copy_(group.master[c0:c1], non_blocking=group.master.is_pinned())
            if p2p:
                handles: list[Any] = []
                for r in range(self.world):
                    if r != self.rank:
                        handles.append(comm.isend(own, r))
                        handles.append(comm.irecv(fg.flat[r * part + c0 : r * part + c1], r))
                self._gathers.append((handles, None))
                continue
            outs = [fg.flat[r * part + c0 : r * part + c1] for r in range(self.world)]
            mine = self._take(c1 - c0, fg.flat.device, fg.dtype)
            mine.copy_(own)
            handle = self._timed(
                functools.partial(comm.all_gather, outs, mine, self.ctx.group, True)
            )
            self._gathers.append(([handle], mine))

    def _wait_gathers(self, upto: int) -> None:
        """Complete the in-flight gather chunks with index < ``upto`` (launch order)."""
        while self._gathered < min(upto, len(self._gathers)):
            handles, buf = self._gathers[self._gathered]
            for handle in handles:
                self._timed(handle.wait)
            if buf is not None:
                self._give(buf)
            self._gathered += 1
        if self._gathered >= len(self._gathers) and self._gathers:
            self._gathers.clear()
            self._gathered = 0
            self._pool.clear()

    def synchronize_parameters(self) -> None:
        if self._gathers:
            self._wait_gathers(len(self._gathers))

    def _all_gather(self, group: _Group) -> None:
        self._launch_gather(group)
        self.synchronize_parameters()

    def _install_gather_hooks(self) -> None:
        """Forward pre-hooks waiting for the gather chunks that carry each module's parameters."""
        where: dict[int, int] = {}  # id(param) -> 1 + index of the last chunk it needs
        base = 0
        for group in self.groups:
            fg = group.flat
            part = fg.partition_numel
            chunks = self._gather_chunks(fg)
            for pi, p in enumerate(fg.params):
                start, stop = fg.offsets[pi], fg.offsets[pi] + p.numel()
                need = 0
                for k, (c0, c1) in enumerate(chunks):
                    for r in range(self.world):
                        if start < r * part + c1 and r * part + c0 < stop:
                            need = max(need, base + k + 1)
                where[id(p)] = need
            base += len(chunks)
        root = self.ctx.module
        for module in root.modules():
            needs = [where[id(p)] for p in module.parameters(recurse=False) if id(p) in where]
            if needs:
                hook = functools.partial(self._before_forward, max(needs))
                self._hooks.append(module.register_forward_pre_hook(hook))
        # Reading weights without a forward: state_dict() sees the gathered values.
        self._hooks.append(
            root.register_state_dict_pre_hook(self._before_state_dict)  # type: ignore[no-untyped-call]
        )

    def _before_forward(self, upto: int, module: torch.nn.Module, args: Any) -> None:
        if self._gathers:
            self._wait_gathers(upto)

    def _before_state_dict(self, module: torch.nn.Module, prefix: str, keep_vars: bool) -> None:
        self.synchronize_parameters()

    def _take(self, numel: int, device: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        free = self._pool.get(numel)
        while free:
            t = free.pop()
            if t.dtype == dtype:
                return t
        return torch.empty(numel, dtype=dtype, device=device)

    def _give(self, t: torch.Tensor) -> None:
        self._pool.setdefault(t.numel(), []).append(t)

    def _zero_gaps(self, group: _Group, bucket: _Bucket, buf: torch.Tensor) -> None:
        # Parameters without a gradient this backward (unused) and the padding contribute zeros.
        pos = 0
        for pi in sorted(bucket.filled):
            off = group.flat.offsets[pi] - bucket.start
            if off > pos:
                buf[pos:off].zero_()
            pos = max(pos, off + group.flat.params[pi].numel())
        if pos < buf.numel():
            buf[pos:].zero_()

    def zero_grad(self) -> None:
        for group in self.groups:
            if group.flat_grad is not None:
                group.flat_grad.zero_()
                if not group.master_is_view:
                    group.master_grad.zero_()
            else:
                group.master_grad.zero_()
                for p in group.flat.params:
                    p.grad = None

    # -- checkpoints -----------------------------------------------------------------------------
    def _sharded_state(self, group: _Group) -> dict[str, torch.Tensor]:
        state = self._optimizer.state.get(group.master, {})
        return {
            k: v
            for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.numel() == group.master.numel() and v.dim() == 1
        }

    def state_dict(self) -> ShardedStateDict:
        self.synchronize_parameters()
        out = ShardedStateDict()
        scalar_state: list[dict[str, Any]] = []
        for group in self.groups:
            fg = group.flat
            start, stop = fg.partition_range()
            sharded = self._sharded_state(group)
            for seg in fg.segments(start, stop):
                p, name = fg.params[seg.index], fg.names[seg.index]
                shape = tuple(p.shape)
                sl = slice(seg.flat_offset, seg.flat_offset + seg.numel)
                ml = slice(seg.flat_offset - group.lo, seg.flat_offset - group.lo + seg.numel)
                out.tensors[f"module.{name}"] = ShardedTensor(
                    TensorMeta(f"module.{name}", shape, _dtype(fg.dtype)),
                    seg.param_offset,
                    fg.flat[sl].detach().clone(),
                )
                if not (group.master_is_view or fg.dtype == torch.float32):
                    out.tensors[f"master.{name}"] = ShardedTensor(
                        TensorMeta(f"master.{name}", shape, "float32"),
                        seg.param_offset,
                        group.master[ml].detach().clone(),
                    )
                for key, value in sharded.items():
                    out.tensors[f"optim.{key}.{name}"] = ShardedTensor(
                        TensorMeta(f"optim.{key}.{name}", shape, _dtype(value.dtype)),
                        seg.param_offset,
                        value[ml].detach().cpu().clone(),
                    )
            state = self._optimizer.state.get(group.master, {})
            scalar_state.append({k: _encode(v) for k, v in state.items() if k not in sharded})
        out.objects["optimizer.param_groups"] = [
            {k: v for k, v in g.items() if k != "params"} for g in self._optimizer.param_groups
        ]
        out.objects["optimizer.scalar_state"] = scalar_state
        return out

    def load_requests(self, metadata: dict[str, TensorMeta]) -> list[LoadRequest]:
        reqs: list[LoadRequest] = []
        for group in self.groups:
            fg = group.flat
            for seg in fg.segments(group.lo, group.hi):
                name = fg.names[seg.index]
                src = f"master.{name}" if f"master.{name}" in metadata else f"module.{name}"
                if src not in metadata:
                    raise _missing(name)
                reqs.append(LoadRequest(src, seg.param_offset, seg.numel))
                prefix = "optim."
                suffix = f".{name}"
                for key in metadata:
                    if key.startswith(prefix) and key.endswith(suffix):
                        state_key = key[len(prefix) : -len(suffix)]
                        if "." not in state_key:
                            reqs.append(LoadRequest(key, seg.param_offset, seg.numel))
        return reqs

    def load_state_dict(self, state: ShardedStateDict) -> None:
        self.synchronize_parameters()
        scalar_state = state.objects.get("optimizer.scalar_state") or []
        saved_groups = state.objects.get("optimizer.param_groups") or []
        for gi, group in enumerate(self.groups):
            fg = group.flat
            moments: dict[str, torch.Tensor] = {}
            for seg in fg.segments(group.lo, group.hi):
                name = fg.names[seg.index]
                ml = slice(seg.flat_offset - group.lo, seg.flat_offset - group.lo + seg.numel)
                src = state.tensors.get(f"master.{name}") or state.tensors.get(f"module.{name}")
                if src is None:
                    raise _missing(name)
                with torch.no_grad():
                    group.master[ml].copy_(_take(src, seg.param_offset, seg.numel))
                prefix, suffix = "optim.", f".{name}"
                for key, shard in state.tensors.items():
                    if key.startswith(prefix) and key.endswith(suffix):
                        state_key = key[len(prefix) : -len(suffix)]
                        if "." in state_key:
                            continue
                        buf = moments.get(state_key)
                        if buf is None:
                            buf = torch.zeros(
                                group.master.numel(),
                                dtype=shard.local.dtype,
                                device=group.master.device,
                            )
                            moments[state_key] = buf
                        buf[ml].copy_(_take(shard, seg.param_offset, seg.numel))
            restored: dict[str, Any] = dict(moments)
            if gi < len(scalar_state):
                restored.update({k: _decode(v) for k, v in scalar_state[gi].items()})
            if restored:
                self._optimizer.state[group.master] = restored
            if gi < len(saved_groups):
                self._optimizer.param_groups[gi].update(saved_groups[gi])
            with torch.no_grad():
                if not group.master_is_view:
                    fg.flat[group.lo : group.hi].copy_(group.master)
            if self.stage >= 1 and self.comm is not None:
                self._all_gather(group)

    # -- introspection ---------------------------------------------------------------------------
    def memory_report(self) -> MemoryReport:
        report = MemoryReport()
        for group in self.groups:
            for k, v in self._optimizer.state.get(group.master, {}).items():
                if not isinstance(v, torch.Tensor):
                    continue
                if v.numel() == group.master.numel():
                    report.optimizer_state_bytes += v.numel() * v.element_size()
                else:  # scalars such as the step count
                    report.details[f"optimizer_scalar.{k}"] = v.numel() * v.element_size()
            grads = group.master_grad.numel() * 4
            if group.flat_grad is not None:
                grads = group.flat_grad.numel() * group.flat_grad.element_size()
                if not group.master_is_view:
                    grads += group.master_grad.numel() * 4
            report.gradient_bytes += grads
            if not group.master_is_view:
                report.master_weight_bytes += group.master.numel() * 4
            report.parameter_bytes += group.flat.flat.numel() * group.flat.flat.element_size()
        report.details["reusable_comm_buffers"] = self.pool_bytes()
        return report

    def pool_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self._pool.values() for t in ts)

    def release(self) -> None:
        self.synchronize_parameters()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


class Stage0(PartitionedStrategy):
    stage = 0

    @property
    def grads_partitioned(self) -> bool:
        return False


class Stage1(PartitionedStrategy):
    stage = 1


class Stage2(PartitionedStrategy):
    stage = 2


# The parameter gather is cut into at least this many chunks per group (each at most
# allgather_bucket_size) so the first modules' weights arrive early in the next forward.
_GATHER_PIECES = 8
_MIN_GATHER_CHUNK = 1 << 18
# Up to this world size gradient buckets are all-reduced even when only the owner needs them.
_ALL_REDUCE_WORLD = 2


_COMM_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def _noop() -> None:
    return None


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _take(shard: ShardedTensor, offset: int, numel: int) -> torch.Tensor:
    # Checkpoint engines return exactly the requested range; accept a wider one too.
    start = offset - shard.offset
    return shard.local.reshape(-1)[start : start + numel]


def _encode(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.detach().cpu().tolist(), "dtype": _dtype(value.dtype)}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "__tensor__" in value:
        return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
    return value


def _missing(name: str) -> Exception:
    from ds.interfaces.errors import CheckpointError

    return CheckpointError(
        f"checkpoint has no weights for parameter {name!r}; was it saved from a different model?"
    )


STAGES: dict[int, type[PartitionedStrategy]] = {0: Stage0, 1: Stage1, 2: Stage2}
