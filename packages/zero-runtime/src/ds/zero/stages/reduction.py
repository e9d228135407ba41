"""Gradient reduction of stages 0-2: bucket by bucket as backward produces the gradients.

Gradients are averaged over the data-parallel ranks: multiplied by ``pre`` before the sum and by
``post`` after it (``prescale_gradients``: 1/world before; ``gradient_predivide_factor`` f: 1/f
before, f/world after), in ``communication_data_type`` when it is set.

* Stages 0-1 reduce at accumulation boundaries only: every bucket of the group's ``flat_grad`` is
  all-reduced (or, at stage 1 with ``reduce_scatter``, its pieces reduced to their owners), and the
  rank keeps what it steps.
* Stage 2 reduces every synchronised micro-step: as each parameter's gradient arrives it is copied
  (scaled, cast) into its bucket's buffer and ``param.grad`` is released; a full bucket is reduced
  and each rank adds its piece into its fp32 partition gradient, with an explicit copy when that
  partition lives on the host (``offload_optimizer.device="cpu"``).
* A backward run without communication (``no_sync``: the engine's coalesced reduction, or stages
  0-1 between boundaries) leaves its gradients where they accumulate locally (the flat gradient at
  stages 0-1, ``param.grad`` at stage 2); :meth:`GradReducer.reduce_deferred` later reduces them
  all as one boundary reduction, exactly as the last backward of a window would have.

All-reduce versus reduce-to-owner is a backend capability
(``CommCapabilities.reduce_to_owner_world``): measured on gloo, one all-reduce of a bucket beats
reducing its pieces to their owners at world 2 (gloo's reduce moves half the bytes at under half
the rate); on NCCL the owner reduction wins from world 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch

from ds.interfaces.comm import ReduceOp
from ds.interfaces.errors import DsError
from ds.zero.stages.groups import Bucket, Group
from ds.zero.stages.pool import BufferPool


class UnusedParametersError(DsError, AssertionError):
    """Trainable parameters got no gradient in an accumulation window while
    ``zero_optimization.ignore_unused_parameters`` is false."""


class DirectBackwardError(DsError, RuntimeError):
    """A gradient arrived from a backward the engine did not run (``loss.backward()``)."""


def _noop() -> None:
    return None


@dataclass(eq=False, repr=False)
class GradReducer:
    groups: list[Group]
    _: KW_ONLY
    stage: int
    comm: Any
    pg: Any
    world: int
    overlap: bool
    reduce_to_owner: bool
    pre: float
    post: float
    comm_dtype: torch.dtype | None
    bucket_dtype: torch.dtype
    pool: BufferPool
    timed: Callable[[Callable[[], Any]], Any]
    # ignore_unused_parameters=false: at each accumulation boundary, every trainable parameter
    # must have received a gradient since the last one.
    check_unused: bool = False
    reduce_now: bool = field(default=False, init=False)
    # A backward since the last reduction left gradients unreduced (see reduce_deferred). The same
    # on every rank: it follows the engine's calls, never the data.
    deferred: bool = field(default=False, init=False)
    _boundary: bool = field(default=False, init=False)
    _in_backward: bool = field(default=False, init=False)
    _used: set[tuple[int, int]] = field(default_factory=set, init=False)
    _pending: list[tuple[Any, Callable[[], None]]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        # reduce() takes the destination as a global rank; owners are ranks of ``pg``.
        self.global_rank = _global_ranks(self.comm, self.pg, self.world)

    # -- micro-step ------------------------------------------------------------------------------
    def begin(self, boundary: bool, no_sync: bool) -> None:
        self._boundary = boundary
        self._in_backward = True
        if self.stage >= 2:
            self.reduce_now = not no_sync
        else:
            self.reduce_now = boundary and not no_sync
            self.attach_grad_views()
        if not self.reduce_now:
            self.deferred = True
        if self.reduce_now:
            for group in self.groups:
                for bucket in group.buckets:
                    bucket.pending = len(bucket.indices)
                    bucket.launched = False
                    bucket.filled.clear()

    def attach_grad_views(self) -> None:
        """Stages 0-1: someone (module.zero_grad(), a client) may have replaced param.grad. Put
        the flat views back (keeping any gradient already there); with a separate accumulation
        buffer, fold a gradient left in param.grad into it."""
        for group in self.groups:
            assert group.flat_grad is not None
            for p, view in zip(group.flat.params, group.grad_views):
                grad = p.grad
                if not group.grads_are_views:
                    if grad is not None:
                        view.copy_(grad)
                        p.grad = None
                    continue
                if grad is not view:
                    if grad is not None:
                        view.copy_(grad)
                    else:
                        view.zero_()
                    p.grad = view

    def on_grad(self, gi: int, pi: int, param: torch.Tensor) -> None:
        """Post-accumulate-grad hook of parameter ``pi`` of group ``gi``."""
        if not self._in_backward:
            # The engine scales the loss and reduces across ranks around its own backward; a
            # gradient arriving outside it would be applied unscaled, unreduced or not at all.
            raise DirectBackwardError(
                "Direct calls to tensor.backward() on a model the ZeRO engine trains bypass its "
                "loss scaling and gradient reduction; call engine.backward(loss) instead "
                "(torch.func transforms, which compute gradients without accumulating them into "
                "the parameters, work as they are)"
            )
        if not getattr(param, "ds_grad_is_ready", True):
            return  # more contributions follow in this backward (tiled compute): keep summing
        if self.check_unused:
            self._used.add((gi, pi))
        group = self.groups[gi]
        if self.stage <= 1 and not group.grads_are_views:
            # Accumulate in the accumulation dtype (fp32 for bf16 models), not in param.grad.
            assert group.flat_grad is not None and param.grad is not None
            group.grad_views[pi].add_(param.grad)
            param.grad = None
        if not self.reduce_now:
            return
        bucket = group.buckets[group.bucket_of[pi]]
        if self.stage >= 2:
            if bucket.buffer is None:
                bucket.buffer = self.pool.take(
                    bucket.stop - bucket.start, group.flat.flat.device, self.bucket_dtype
                )
            bucket.filled.append(pi)
            off = group.flat.offsets[pi] - bucket.start
            assert param.grad is not None
            dst = bucket.buffer[off : off + param.numel()]
            # One pass: cast to the communication dtype and apply the pre-reduction scale.
            if self.pre != 1.0:
                torch.mul(param.grad.reshape(-1), self.pre, out=dst)
            else:
                dst.copy_(param.grad.reshape(-1))
            param.grad = None
        bucket.pending -= 1
        if bucket.pending == 0 and self.overlap:
            self._launch(group, bucket)

    def end_backward(self) -> None:
        if self.reduce_now and self.deferred and self.stage >= 2:
            # Gradients an earlier backward without communication left in param.grad and this
            # one did not add to (its hooks took the others): reduced with this window's.
            for gi, group in enumerate(self.groups):
                for pi, p in enumerate(group.flat.params):
                    if p.grad is not None:
                        self.on_grad(gi, pi, p)
        self._in_backward = False
        if self.check_unused and self._boundary:
            self._check_all_used()
        if not self.reduce_now:
            return
        for group in self.groups:
            for bucket in group.buckets:
                if not bucket.launched:
                    self._launch(group, bucket)
        pending, self._pending = self._pending, []
        for handle, finish in pending:
            if handle is not None:
                self.timed(handle.wait)
            finish()
        # Buffers are reused within a backward (bucket after bucket) but not kept past it.
        self.pool.clear()
        if self.stage <= 1:
            for group in self.groups:
                if not group.master_grad_is_view:
                    assert group.flat_grad is not None
                    group.master_grad.copy_(group.flat_grad[group.lo : group.hi])
        self.reduce_now = False
        self.deferred = False  # stages 0-1 reduced the whole flat gradient; stage 2 every grad

    def reduce_deferred(self) -> None:
        """Reduce the gradients that backward passes without communication left accumulated
        locally, as one boundary reduction (nothing to do when there are none). Every rank calls
        it at the same point of its loop."""
        if self.deferred:
            self.begin(True, False)  # a backward with no gradients: end_backward reduces them
            self.end_backward()

    def _check_all_used(self) -> None:
        used, self._used = self._used, set()
        unused = [
            f"group {gi} parameter {pi} {tuple(p.shape)}"
            for gi, group in enumerate(self.groups)
            for pi, p in enumerate(group.flat.params)
            if p.requires_grad and (gi, pi) not in used
        ]
        if unused:
            raise UnusedParametersError(
                f"{len(unused)} trainable parameter(s) got no gradient in this accumulation "
                f"window ({', '.join(unused[:8])}{', ...' if len(unused) > 8 else ''}): make every "
                "trainable parameter contribute to the loss, freeze the unused ones "
                "(requires_grad=False), or set zero_optimization.ignore_unused_parameters to true"
            )

    # -- one bucket ------------------------------------------------------------------------------
    def _launch(self, group: Group, bucket: Bucket) -> None:
        bucket.launched = True
        target: torch.Tensor | None = None  # stages 0-1: where the reduced values go back
        if self.stage >= 2:
            if bucket.buffer is None:  # no parameter of the bucket got a gradient
                bucket.buffer = self.pool.take(
                    bucket.stop - bucket.start, group.flat.flat.device, self.bucket_dtype
                )
            _zero_gaps(group, bucket, bucket.buffer)
            data = bucket.buffer
        else:
            assert group.flat_grad is not None
            data = group.flat_grad[bucket.start : bucket.stop]
            comm_dtype = self.comm_dtype or data.dtype
            if self.comm is not None and comm_dtype != data.dtype:
                # Reduce a copy in the communication dtype; the result is written back in _finish.
                target = data
                data = self.pool.take(data.numel(), data.device, comm_dtype)
                if self.pre != 1.0:
                    torch.mul(target, self.pre, out=data)
                else:
                    data.copy_(target)
            elif self.comm is not None and self.pre != 1.0:
                data.mul_(self.pre)
        finish = functools.partial(self._finish, group, bucket, data, target)
        # Expert parameters are summed over their own replica group (still averaged over the
        # whole data-parallel world by pre/post: their tokens came from every rank).
        pg, owners_global = self.pg, self.global_rank
        if group.replica_ranks is not None:
            pg, owners_global = group.replica_pg, list(group.replica_ranks)
        if self.comm is None or len(owners_global) == 1:
            self._pending.append((None, finish))
            return
        comm = self.comm
        handles: list[Any] = []
        if self.reduce_to_owner:
            for owner, lo, hi in group.flat.owners(bucket.start, bucket.stop):
                piece = data[lo - bucket.start : hi - bucket.start]
                handles.append(
                    self.timed(
                        functools.partial(
                            comm.reduce, piece, owners_global[owner], ReduceOp.SUM, pg, True
                        )
                    )
                )
        else:
            handles.append(
                self.timed(functools.partial(comm.all_reduce, data, ReduceOp.SUM, pg, True))
            )
        for h in handles[:-1]:
            self._pending.append((h, _noop))
        self._pending.append((handles[-1], finish))

    def _finish(
        self, group: Group, bucket: Bucket, data: torch.Tensor, target: torch.Tensor | None
    ) -> None:
        post = self.post
        if self.stage >= 2:
            lo, hi = max(bucket.start, group.lo), min(bucket.stop, group.hi)
            if lo < hi:
                piece = data[lo - bucket.start : hi - bucket.start]
                dst = group.master_grad[lo - group.lo : hi - group.lo]
                if piece.device != dst.device:
                    # The partition gradient lives on the host (optimizer offload): an explicit
                    # device-to-host copy, never device values added into a host tensor.
                    piece = piece.to(dst.device)
                # Accumulated in fp32 whatever dtype the reduction ran in.
                dst.add_(piece, alpha=post)
            self.pool.give(data)
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
            self.pool.give(data)


def _zero_gaps(group: Group, bucket: Bucket, buf: torch.Tensor) -> None:
    # Parameters without a gradient this backward (unused) and the padding contribute zeros.
    pos = 0
    for pi in sorted(bucket.filled):
        off = group.flat.offsets[pi] - bucket.start
        if off > pos:
            buf[pos:off].zero_()
        pos = max(pos, off + group.flat.params[pi].numel())
    if pos < buf.numel():
        buf[pos:].zero_()


def _global_ranks(comm: Any, pg: Any, world: int) -> list[int]:
    """Global rank of each rank of ``pg`` (the world when ``pg`` is None)."""
    if comm is None or pg is None:
        return list(range(world))
    return [int(comm.get_global_rank(pg, r)) for r in range(world)]
