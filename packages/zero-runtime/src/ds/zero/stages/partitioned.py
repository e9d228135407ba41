"""ZeRO stages 0, 1 and 2 over flat, padded parameter buffers.

* Stage 0: gradients live in one flat buffer per group and are all-reduced in buckets; every rank
  steps the whole model.
* Stage 1: as stage 0, but each rank keeps optimizer state (and fp32 master weights) only for its
  partition, steps it, and the updated partitions are all-gathered into the module's weights.
* Stage 2: as stage 1, but gradients are not kept whole: as backward produces them they are copied
  into bucket buffers and reduced to the rank owning each piece, which accumulates it into its
  contiguous fp32 partition gradient.

The parts, one concern each: :mod:`~ds.zero.stages.groups` (the per-group state),
:mod:`~ds.zero.stages.reduction` (gradient buckets and their reduction),
:mod:`~ds.zero.stages.gather` (the parameter all-gather and its forward hooks),
:mod:`~ds.zero.stages.pool` (reusable buffers), :mod:`~ds.zero.stages.sharded_io` (checkpoint
state) and :mod:`~ds.zero.stages.memory` (the memory report). This module wires them and holds the
precision and capability choices.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, TensorMeta
from ds.interfaces.comm import GLOO_CAPABILITIES, comm_capabilities
from ds.interfaces.errors import ConfigError
from ds.zero.dtypes import named_dtype
from ds.zero.param_groups import group_meta, hyper_params
from ds.zero.stages import sharded_io
from ds.zero.stages.base import MemoryReport, StepReport, StrategyContext, ZeroStrategy
from ds.zero.stages.flat import FlatGroup
from ds.zero.stages.gather import ParamGather
from ds.zero.stages.groups import Group, build_group
from ds.zero.stages.host_pins import HostPins
from ds.zero.stages.matrices import bind_matrix_layouts
from ds.zero.stages.memory import memory_report
from ds.zero.stages.pool import BufferPool
from ds.zero.stages.reduction import GradReducer


def grad_accum_dtype(ctx: StrategyContext, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype stages 0-1 accumulate gradients in: ``data_types.grad_accum_dtype`` when set,
    else fp32 for bf16 models (as DeepSpeed's bf16 optimizer does: bf16 sums lose the small
    micro-batch contributions), else the model dtype."""
    data_types = getattr(ctx.config.raw, "data_types", None)
    chosen = named_dtype(
        "data_types.grad_accum_dtype", getattr(data_types, "grad_accum_dtype", None)
    )
    if chosen is not None:
        return chosen
    return torch.float32 if model_dtype == torch.bfloat16 else model_dtype


# Stages 1-2 start each rank's piece of a gathered buffer on a 4-byte boundary of 16-bit elements
# (DeepSpeed's nccl_start_alignment_factor), so a gather bucket holds an even number of them.
START_ALIGNMENT = 2


class BucketSizeError(ConfigError, AssertionError):
    """A bucket size stages 1-2 cannot cut on their alignment (an AssertionError in DeepSpeed,
    so it is one here too)."""


class PartitionedStrategy(ZeroStrategy):
    stage = 0

    def __init__(self, ctx: StrategyContext) -> None:
        super().__init__(ctx)
        cfg = ctx.config
        if self.stage in (1, 2) and cfg.allgather_bucket_size % START_ALIGNMENT:
            size = cfg.allgather_bucket_size
            raise BucketSizeError(
                f"zero_optimization.allgather_bucket_size must be a multiple of "
                f"nccl_start_alignment_factor ({START_ALIGNMENT}) at ZeRO stage {self.stage}, got "
                f"{size}; use {size - 1} or {size + 1}"
            )
        self.world = ctx.world_size
        self.rank = ctx.rank
        self.comm = ctx.comm if self.world > 1 else None
        self.caps = comm_capabilities(self.comm, ctx.group) if self.comm else GLOO_CAPABILITIES
        self.overlap = cfg.zero.overlap
        self.reduce_to_owner = (
            bool(cfg.zero.reduce_scatter)
            and self.stage >= 1
            and self.world >= self.caps.reduce_to_owner_world
        )
        self.offload = cfg.zero.offload_optimizer_device == "cpu"
        off = cfg.zero.offload_optimizer
        self.pins = HostPins(ctx.accelerator, self.offload and off is not None and off.pin_memory)
        raw = cfg.raw
        factor = float(raw.gradient_predivide_factor)
        if self.comm is None or raw.gradient_allreduce_op == "sum":
            pre, post = 1.0, 1.0  # "sum": ranks' gradients are added, not averaged
        elif raw.prescale_gradients:
            pre, post = 1.0 / self.world, 1.0
        else:
            pre, post = 1.0 / factor, factor / self.world
        comm_dtype = named_dtype("communication_data_type", raw.communication_data_type)
        # Stage 2's bucket buffers: the communication dtype when set, else fp32 (the partition
        # gradient they accumulate into is fp32).
        bucket_dtype = comm_dtype if (self.comm is not None and comm_dtype) else torch.float32
        self.pool = BufferPool()
        self.groups: list[Group] = []
        self._tp_flags: list[bool] = []  # per group: holds tensor-parallel slices
        self._pp_flags: list[bool] = []  # per group: holds tied copies an earlier stage counts
        opt_groups: list[dict[str, Any]] = []
        bucket_numel = max(1, cfg.reduce_bucket_size)
        for user_group in ctx.param_groups:
            params = [p for p in user_group["params"] if p.requires_grad]
            names = [ctx.param_names[id(p)] for p in params]
            meta = group_meta(user_group)
            replica = meta.replica  # expert parameters: ds.interfaces.moe
            world, rank = self.world, self.rank
            if replica is not None:
                world = replica.size if self.comm is not None else 1
                rank = replica.ranks.index(self._global_rank()) if world > 1 else 0
            fg = FlatGroup(params, names, world, rank)
            group = build_group(
                fg,
                stage=self.stage,
                offload=self.offload,
                accum_dtype=grad_accum_dtype(ctx, fg.dtype),
                bucket_numel=bucket_numel,
                kernels=ctx.kernels,
                host=self._host,
            )
            if replica is not None:
                group.replica_pg, group.replica_ranks = replica.group, replica.ranks
            self.groups.append(group)
            # Experts folded onto tensor parallelism differ across the TP ranks, as slices do.
            self._tp_flags.append(meta.tp_sliced or replica is not None)
            self._pp_flags.append(meta.pp_replica)
            opt_groups.append({**hyper_params(user_group), "params": [group.master]})
        self._optimizer = ctx.optimizer_factory(opt_groups)
        bind_matrix_layouts(self._optimizer, self.groups, self.comm, ctx.group)
        self.reducer = GradReducer(
            self.groups,
            stage=self.stage,
            comm=self.comm,
            pg=ctx.group,
            world=self.world,
            overlap=self.overlap,
            reduce_to_owner=self.reduce_to_owner,
            pre=pre,
            post=post,
            comm_dtype=comm_dtype,
            bucket_dtype=bucket_dtype,
            pool=self.pool,
            timed=self._timed,
            check_unused=not cfg.zero.ignore_unused_parameters,
        )
        self.gather = ParamGather(
            self.groups,
            comm=self.comm,
            pg=ctx.group,
            world=self.world,
            rank=self.rank,
            allgather_numel=max(1, cfg.allgather_bucket_size // max(self.world, 1)),
            caps=self.caps,
            pool=self.pool,
            timed=self._timed,
        )
        self._hooks: list[Any] = []
        for gi, group in enumerate(self.groups):
            for pi, p in enumerate(group.flat.params):
                hook = functools.partial(self.reducer.on_grad, gi, pi)
                self._hooks.append(p.register_post_accumulate_grad_hook(hook))
        if self.stage >= 1 and self.comm is not None:
            self._hooks.extend(self.gather.install_hooks(ctx.module))

    def _global_rank(self) -> int:
        return int(self.comm.get_rank()) if self.comm is not None else 0

    def replica_weights(self) -> Sequence[float] | None:
        # Per group, the share of its squared gradient norm this rank adds so that the sum over
        # the data-parallel world counts every parameter once: partitioned state is disjoint
        # (1); stage 0 holds whole copies on every rank of the group's replica set (1/size).
        if all(g.replica_ranks is None for g in self.groups):
            return None
        if self.grads_partitioned:
            return [1.0] * len(self.groups)
        return [1.0 / len(g.replica_ranks or range(self.world)) for g in self.groups]

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the host; with ``offload_optimizer.pin_memory``, page-locked through the
        accelerator (:class:`HostPins`) so the copies back to the device run asynchronously."""
        return self.pins.pin(t.cpu())

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @property
    def _gathers(self) -> list[Any]:
        """The parameter-gather chunks still in flight (empty when the weights are whole)."""
        return self.gather.in_flight

    # -- backward --------------------------------------------------------------------------------
    def begin_micro_step(self, boundary: bool, no_sync: bool = False) -> None:
        self.reducer.begin(boundary, no_sync)

    def end_backward(self) -> None:
        self.reducer.end_backward()

    def reduce_deferred(self) -> None:
        self.reducer.reduce_deferred()

    # -- step ------------------------------------------------------------------------------------
    def local_grad_shards(self) -> Sequence[torch.Tensor]:
        return [g.master_grad for g in self.groups]

    def prepare_step(self, loss_scale: float, clip: float, check_overflow: bool) -> StepReport:
        if self.stage <= 1:
            self._adopt_assigned_grads()
        return super().prepare_step(loss_scale, clip, check_overflow)

    def _adopt_assigned_grads(self) -> None:
        """Stages 0-1: a gradient assigned to ``param.grad`` after the backward (by hand, as
        scripts written for DeepSpeed's unpartitioned fp16 optimizer do) replaces what the
        backward left in the flat gradient, so the step, its norm and the overflow check see it."""
        for group in self.groups:
            if group.flat_grad is None:
                continue
            adopted = False
            for p, view in zip(group.flat.params, group.grad_views):
                grad = p.grad
                if grad is None or grad is view:
                    continue
                view.copy_(grad.reshape(view.shape))
                p.grad = view if group.grads_are_views else None
                adopted = True
            if adopted and not group.master_grad_is_view:
                group.master_grad.copy_(group.flat_grad[group.lo : group.hi])

    def grad_shards_by_group(self) -> list[list[torch.Tensor]]:
        """This rank's gradient shards, one list per optimizer parameter group."""
        return [[g.master_grad] for g in self.groups]

    def tp_sliced(self) -> Sequence[bool]:
        return self._tp_flags

    def pp_replicas(self) -> Sequence[bool]:
        return self._pp_flags

    def grad_buffer(self, param: torch.Tensor) -> torch.Tensor | None:
        """Stages 0-1: where ``param``'s gradient accumulates between boundaries (its view of
        the flat gradient), for code that must change it before the boundary reduction."""
        for group in self.groups:
            if group.flat_grad is None:
                continue
            for p, view in zip(group.flat.params, group.grad_views):
                if p is param:
                    return view.view_as(param)
        return None

    def step(self) -> None:
        # The optimizer writes the partitions the previous all-gather reads and fills.
        self.synchronize_parameters()
        for group in self.groups:
            group.master.grad = group.master_grad
        self._optimizer.step()
        for group in self.groups:
            group.master.grad = None
            if self.stage >= 1 and self.comm is not None:
                self.gather.launch(group)
            elif not group.master_is_view:
                group.flat.flat[group.lo : group.hi].copy_(group.master)
        # Without overlap_comm the module's weights are whole when step() returns, so code that
        # reads them directly (EMA copies, submodule state_dicts) needs no synchronisation.
        if not self.overlap:
            self.synchronize_parameters()

    def synchronize_parameters(self) -> None:
        self.gather.synchronize()

    def zero_grad(self) -> None:
        self.reducer.deferred = False  # nothing left to reduce
        for group in self.groups:
            if group.flat_grad is not None:
                group.flat_grad.zero_()
                if not group.master_grad_is_view:
                    group.master_grad.zero_()
            else:
                group.master_grad.zero_()
                for p in group.flat.params:
                    p.grad = None

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> ShardedStateDict:
        self.synchronize_parameters()
        return sharded_io.state_dict(self.groups, self._optimizer)

    def load_requests(self, metadata: dict[str, TensorMeta]) -> list[LoadRequest]:
        return sharded_io.load_requests(self.groups, metadata)

    def load_state_dict(self, state: ShardedStateDict) -> None:
        self.synchronize_parameters()
        regather = self.gather.gather_now if self.stage >= 1 and self.comm is not None else None
        sharded_io.load_state_dict(self.groups, self._optimizer, state, regather)

    # -- introspection ---------------------------------------------------------------------------
    def memory_report(self) -> MemoryReport:
        return memory_report(self.groups, self._optimizer, self.pool.nbytes())

    def pool_bytes(self) -> int:
        return self.pool.nbytes()

    def release(self) -> None:
        self.synchronize_parameters()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self.pins.release()


class Stage0(PartitionedStrategy):
    stage = 0

    @property
    def grads_partitioned(self) -> bool:
        return False


class Stage1(PartitionedStrategy):
    stage = 1


class Stage2(PartitionedStrategy):
    stage = 2


STAGES: dict[int, type[PartitionedStrategy]] = {0: Stage0, 1: Stage1, 2: Stage2}
