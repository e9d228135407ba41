"""The per-group training state of stages 0-2: flat weights, fp32 master, gradient buffers.

Each user parameter group becomes a :class:`~ds.zero.stages.flat.FlatGroup` (the parameters are
views into one padded flat buffer) plus:

* ``master``: the fp32 weights this rank's optimizer steps (its partition at stages 1-2, all of it
  at stage 0); a view of the flat buffer for an fp32 model without offload, else a copy (on the
  host with ``offload_optimizer.device="cpu"``);
* ``flat_grad`` (stages 0-1): the whole group's gradients in the accumulation dtype. When that is
  the model dtype, ``param.grad`` are views into it and autograd accumulates in place; otherwise
  (bf16 models accumulate in fp32 by default, ``data_types.grad_accum_dtype`` chooses) each
  backward's ``param.grad`` is added into it by a hook and released;
* ``master_grad``: the fp32 gradient of ``master`` (a view of ``flat_grad`` when that is fp32 on the
  master's device; at stage 2, the partition the reduced buckets accumulate into);
* the gradient buckets, in backward order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ds.interfaces.kernels import KernelProvider
from ds.zero.stages.flat import FlatGroup, build_buckets


@dataclass
class Bucket:
    start: int
    stop: int
    indices: list[int]
    pending: int = 0
    launched: bool = False
    buffer: torch.Tensor | None = None  # stage 2: the bucket's gradients
    filled: list[int] = field(default_factory=list)  # stage 2: parameters copied into buffer


@dataclass
class Group:
    flat: FlatGroup
    lo: int  # range of the flat buffer this rank's optimizer steps
    hi: int
    master: torch.Tensor  # fp32, hi - lo elements
    master_grad: torch.Tensor  # fp32, hi - lo elements
    master_is_view: bool  # master is flat.flat[lo:hi]
    flat_grad: torch.Tensor | None  # stages 0-1: gradients of the whole group
    grads_are_views: bool  # stages 0-1: param.grad are views into flat_grad
    master_grad_is_view: bool  # master_grad is flat_grad[lo:hi]
    grad_views: list[torch.Tensor] = field(default_factory=list)  # flat_grad per parameter
    buckets: list[Bucket] = field(default_factory=list)
    bucket_of: dict[int, int] = field(default_factory=dict)
    # Parameters held by a subset of the data-parallel ranks (experts, ds.interfaces.moe): the
    # group the flat buffer is partitioned and reduced over, and its global ranks. None: the
    # strategy's data-parallel group.
    replica_pg: Any = None
    replica_ranks: tuple[int, ...] | None = None


def build_group(
    fg: FlatGroup,
    *,
    stage: int,
    offload: bool,
    accum_dtype: torch.dtype,
    bucket_numel: int,
    kernels: KernelProvider | None,
    host: Callable[[torch.Tensor], torch.Tensor],
) -> Group:
    lo, hi = fg.partition_range() if stage >= 1 else (0, fg.padded)
    master_is_view = fg.dtype == torch.float32 and not offload
    if master_is_view:
        master = fg.flat[lo:hi]
    else:
        master = fg.flat[lo:hi].detach().to(torch.float32, copy=True)
        if offload:
            master = host(master)
    flat_grad: torch.Tensor | None = None
    grads_are_views = False
    views: list[torch.Tensor] = []
    if stage <= 1:
        flat_grad = torch.zeros(fg.padded, dtype=accum_dtype, device=fg.flat.device)
        grads_are_views = accum_dtype == fg.dtype
        views = [fg.view(flat_grad, i) for i in range(len(fg.params))]
        if grads_are_views:
            for p, view in zip(fg.params, views):
                p.grad = view
    master_grad_is_view = (
        flat_grad is not None
        and flat_grad.dtype == torch.float32
        and flat_grad.device == master.device
    )
    if master_grad_is_view:
        assert flat_grad is not None
        master_grad = flat_grad[lo:hi]
    elif offload and kernels is not None and master.device.type == "cpu":
        # The offloaded step walks the master copy and its grad in lockstep: the provider
        # places the grad apart from it (KernelProvider.new_state).
        master_grad = kernels.new_state(master, (master,))
    else:
        master_grad = torch.zeros(hi - lo, dtype=torch.float32, device=master.device)
    group = Group(
        fg,
        lo,
        hi,
        master,
        master_grad,
        master_is_view,
        flat_grad,
        grads_are_views,
        master_grad_is_view,
        views if flat_grad is not None else [],
    )
    for b, (start, stop, indices) in enumerate(build_buckets(fg, bucket_numel)):
        group.buckets.append(Bucket(start, stop, indices))
        for i in indices:
            group.bucket_of[i] = b
    return group
