"""Stage 3 as a :class:`ds.zero.stages.base.ZeroStrategy`: what the engine drives at stage 3."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, TensorMeta
from ds.interfaces.parallel import tp_dim
from ds.zero.stage3.collectives import Collectives
from ds.zero.stage3.leaf import apply_leaf_config, mark_by_granularity
from ds.zero.stage3.nvme_room import check_room, ranks_per_node, stage3_needs
from ds.zero.stage3.optimizer import Stage3Optimizer
from ds.zero.stage3.partitioner import Stage3Limits, Stage3Partitioner
from ds.zero.stage3.shard import is_partitioned, partition_param, shard_of
from ds.zero.stage3.state import load_requests, load_state, save_state
from ds.zero.stage3.swap import AioSettings, ParamSwapper, open_aio
from ds.zero.stages.base import MemoryReport, StrategyContext, ZeroStrategy

_DEFAULTS = Stage3Limits()


def _int(value: Any, default: int) -> int:
    return default if value in (None, "auto") else int(value)


def limits_from(zero: Any, reduce_bucket_size: int) -> Stage3Limits:
    return Stage3Limits(
        prefetch_bucket_size=_int(zero.prefetch_bucket_size, _DEFAULTS.prefetch_bucket_size),
        max_live_parameters=_int(zero.max_live_parameters, _DEFAULTS.max_live_parameters),
        max_reuse_distance=_int(zero.max_reuse_distance, _DEFAULTS.max_reuse_distance),
        param_persistence_threshold=_int(
            zero.param_persistence_threshold, _DEFAULTS.param_persistence_threshold
        ),
        reduce_bucket_size=reduce_bucket_size,
        memory_efficient_linear=bool(getattr(zero, "memory_efficient_linear", True)),
    )


def aio_from(aio: Any) -> AioSettings:
    return AioSettings(
        block_size=int(aio.block_size),
        queue_depth=int(aio.queue_depth),
        thread_count=int(aio.intra_op_parallelism),
        single_submit=bool(aio.single_submit),
        overlap_events=bool(aio.overlap_events),
    )


def compute_device(ctx: StrategyContext) -> torch.device:
    """The rank's device: the accelerator's current device when there is one, else the
    model's."""
    if ctx.accelerator is not None:
        return torch.device(ctx.accelerator.current_device_name())
    return torch.device(ctx.device)


def _pin(ctx: StrategyContext, zero: Any) -> Any:
    """The accelerator's pin_memory when offloaded shards should be pinned, else None."""
    op = zero.offload_param
    acc = ctx.accelerator
    if op is None or not op.pin_memory or acc is None or not acc.capabilities().has_pinned_memory:
        return None
    return acc.pin_memory


def check_nvme_room(
    module: torch.nn.Module, zero: Any, groups: list[dict[str, Any]], threshold: int
) -> None:
    """Refuse, naming the bytes, an NVMe offload whose paths lack room for the swap files."""
    if "nvme" not in (zero.offload_param_device, zero.offload_optimizer_device):
        return
    params = [shard_of(p) for p in {id(p): p for p in module.parameters()}.values()]
    # A parameter the engine does not manage is the optimizer's own error, raised later.
    trained = {id(p): p for g in groups for p in g["params"] if is_partitioned(p)}
    needs = stage3_needs(zero, params, [shard_of(p) for p in trained.values()], threshold)
    check_room(needs, ranks_per_node())


def place_shard(
    p: torch.nn.Parameter, s: Any, shard_device: torch.device, device: torch.device
) -> None:
    """Move an existing shard (``ds.zero.Init`` built it) to ``shard_device`` and the
    parameter's data to ``device``, with explicit copies."""
    if s.shard.device != shard_device:
        s.shard = s.shard.to(shard_device)
    src = s.extra.get("master_src")
    if src is not None and src.device != shard_device:
        s.extra["master_src"] = src.to(shard_device)
    if p.data.device != device:
        p.data = p.data.to(device)


class Stage3Strategy(ZeroStrategy):
    """Parameters, gradients and optimizer state all partitioned per parameter across ranks."""

    stage = 3

    def __init__(self, ctx: StrategyContext) -> None:
        super().__init__(ctx)
        cfg = ctx.config
        zero = cfg.zero
        # use_all_reduce_for_fetch_params forces all-reduce fetches everywhere; otherwise host
        # tensors use them (see Collectives.all_reduce) and accelerator tensors all-gather.
        self.limits = limits_from(zero, cfg.reduce_bucket_size)
        # Collectives run on the compute device (the accelerator's, else the model's);
        # offload_param keeps the shards on the host and copies them there on fetch.
        self.device = compute_device(ctx)
        host = torch.device("cpu")
        self.shard_device = host if zero.offload_param_device in ("cpu", "nvme") else self.device
        # use_all_reduce_for_fetch_params forces the in-place host-tensor collectives everywhere;
        # otherwise host tensors use them (see Collectives) and device tensors go in buckets.
        self.coll = Collectives(
            ctx.comm,
            ctx.group,
            check_order=bool(zero.check_module_order),
            all_reduce=True if zero.use_all_reduce_for_fetch_params else None,
            device=self.device,
            bucket_numel=self.limits.prefetch_bucket_size,
        )
        module = ctx.module
        pin = _pin(ctx, zero)
        for p in module.parameters():
            if is_partitioned(p):
                s = shard_of(p)
                if s.dtype != p.dtype:
                    # Parameters cast to a lower precision after ds.zero.Init partitioned them:
                    # cast the shards too, keeping the fp32 values as the master copy.
                    if s.dtype == torch.float32:
                        s.extra["master_src"] = s.shard
                    s.shard = s.shard.to(p.dtype)
                    s.dtype = p.dtype
                place_shard(p, s, self.shard_device, self.device)
            else:
                partition_param(
                    p,
                    self.coll.rank,
                    self.coll.world,
                    0,
                    shard_device=self.shard_device,
                    device=self.device,
                )
            if pin is not None and zero.offload_param_device == "cpu":
                shard_of(p).shard = pin(shard_of(p).shard)
        # Room for the NVMe swap files, before the first byte of them is written.
        check_nvme_room(module, zero, ctx.param_groups, self.limits.param_persistence_threshold)
        aio = aio_from(cfg.raw.aio)
        swapper = None
        if zero.offload_param_device == "nvme":
            op = zero.offload_param
            assert op is not None
            swapper = ParamSwapper(
                open_aio(ctx.kernels, aio),
                op.nvme_path or "",
                self.coll.rank,
                max_in_cpu=int(op.max_in_cpu) if op.max_in_cpu < 1_000_000_000 else 0,
                buffer_count=int(op.buffer_count),
                pin_memory=bool(op.pin_memory),
            )
        apply_leaf_config(module, zero.leaf_module)
        mark_by_granularity(module, _int(zero.module_granularity_threshold, 0))
        self.partitioner = Stage3Partitioner(module, self.coll, self.limits, swapper)
        # offload_optimizer=cpu: masters on the host, stepped by the optimizer the engine's
        # factory builds from the kernel provider (CPU kernels), gradients copied to the host.
        oo = zero.offload_optimizer
        device = zero.offload_optimizer_device
        self.opt = Stage3Optimizer(
            self.partitioner,
            ctx.param_groups,
            ctx.optimizer_factory,
            offload=device if device in ("cpu", "nvme") else "none",
            kernels=ctx.kernels,
            nvme_path=oo.nvme_path if oo is not None else None,
            aio=aio,
            buffer_count=int(oo.buffer_count) if oo is not None else 4,
            pin_memory=bool(oo.pin_memory) if oo is not None else False,
            accelerator=ctx.accelerator,
        )

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.opt.optimizer

    # -- backward --------------------------------------------------------------------------------
    def begin_micro_step(self, boundary: bool, no_sync: bool = False) -> None:
        # Stage 3 does not keep whole gradients, so every backward reduces into the partitions
        # (summing reduced micro-batch gradients equals reducing their sum); without
        # communication, each parameter's full gradients are held and summed until
        # reduce_deferred.
        self.partitioner.grads.deferring = no_sync

    def end_backward(self) -> None:
        self.partitioner.after_backward()

    def reduce_deferred(self) -> None:
        self.partitioner.grads.reduce_held()
        self.partitioner.pool.collect()

    def local_grad_shards(self) -> Sequence[torch.Tensor]:
        return [g for g in (shard_of(p).grad for p in self.partitioner.params) if g is not None]

    def grad_shards_by_group(self) -> list[list[torch.Tensor]]:
        """This rank's gradient partitions, one list per optimizer parameter group."""
        return [
            [g for g in (shard_of(p).grad for p in originals) if g is not None]
            for _, originals in self.opt._hyper_groups
        ]

    def tp_sliced(self) -> Sequence[bool]:
        return [
            tp_dim(p) is not None for p in self.partitioner.params if shard_of(p).grad is not None
        ]

    def step(self) -> None:
        self.opt.step()

    def zero_grad(self) -> None:
        self.partitioner.grads.drop_held()
        self.opt.zero_grad()

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> ShardedStateDict:
        return save_state(self.opt)

    def load_requests(self, metadata: dict[str, TensorMeta]) -> list[LoadRequest]:
        return load_requests(self.opt, metadata)

    def load_state_dict(self, state: ShardedStateDict) -> None:
        load_state(self.opt, state)

    # -- introspection ---------------------------------------------------------------------------
    def memory_report(self) -> MemoryReport:
        rep = MemoryReport()
        acct = self.partitioner.acct
        rep.parameter_bytes = acct.partition_bytes
        rep.details["live_parameter_bytes"] = acct.live_bytes
        rep.details["peak_live_parameter_bytes"] = acct.peak_live_bytes
        rep.details["peak_resident_parameter_bytes"] = acct.peak_resident_bytes
        for p in self.partitioner.params:
            s = shard_of(p)
            if s.grad is not None:
                rep.gradient_bytes += s.grad.numel() * s.grad.element_size()
            master = self.opt._masters.get(s.ds_id)
            if master is None:  # a parameter no optimizer group holds (frozen, or no optimizer)
                continue
            if not self.opt.shares_shard(s):
                rep.master_weight_bytes += master.numel() * master.element_size()
            st = self.opt.optimizer.state.get(master, {})
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    rep.optimizer_state_bytes += v.numel() * v.element_size()
        return rep

    def consolidated_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        from ds.zero.stage3.consolidate import consolidated_state_dict

        return consolidated_state_dict(self.partitioner, dtype)

    def empty_partition_cache(self) -> None:
        self.partitioner.empty_cache()

    def release(self) -> None:
        self.partitioner.remove_hooks()
        self.opt.close()
        if self.partitioner.swapper is not None:
            self.partitioner.swapper.close()
