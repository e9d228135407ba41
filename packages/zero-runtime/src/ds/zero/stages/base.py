"""The contract between the training engine and a ZeRO stage.

The engine owns the training loop (micro-steps, loss scaling, clipping policy, LR schedule,
telemetry, checkpoint files); a :class:`ZeroStrategy` owns where parameters, gradients and optimizer
state live and how they move between ranks. Stages 0, 1 and 2 live in this package; stage 3
implements the same class and is selected by ``zero_optimization.stage``.

One optimizer step, as the engine drives it::

    strategy.begin_micro_step(boundary, no_sync)  # before each backward: will grads be reduced now?
    loss.backward()                         # the strategy's autograd hooks reduce buckets
    strategy.end_backward()                 # flush the last buckets, wait for all collectives
    ... (repeat for each micro-batch) ...
    strategy.reduce_deferred()              # what no_sync backwards left unreduced, reduced once
    report = strategy.prepare_step(loss_scale, clip)  # unscale, overflow, global norm, clip
    if not report.overflow:
        strategy.step()                     # optimizer on this rank's partition, then gather
    strategy.zero_grad()

Rules every implementation follows:

* Gradients are *averaged* over data-parallel ranks (divided by the world size) and summed over
  micro-steps; the engine divides the loss by ``gradient_accumulation_steps`` itself.
* ``prepare_step`` returns the same ``overflow`` and ``grad_norm`` on every rank (it reduces across
  ranks when gradients are partitioned).
* ``optimizer`` is a ``torch.optim.Optimizer`` whose ``param_groups`` mirror the user's groups
  (same order, same hyper-parameters), so LR schedulers written for torch work unchanged.
* ``state_dict`` returns the rank's shards as flat element ranges of logical tensors named
  ``module.<param>`` (model-dtype weights), ``master.<param>`` (fp32 weights when they differ from
  the module's) and ``optim.<state>.<param>`` (optimizer moments); ``load_state_dict`` accepts the
  shards this rank asked for in ``load_requests``, whatever world size or stage wrote them.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from ds.interfaces.accelerator import Accelerator
    from ds.interfaces.checkpoint import LoadRequest, ShardedStateDict, TensorMeta
    from ds.interfaces.comm import Communicator
    from ds.interfaces.kernels import KernelProvider
    from ds.zero.comm_stats import CommStats
    from ds.zero.config import ResolvedConfig


def torch_zero(device: torch.device) -> torch.Tensor:
    import torch

    return torch.zeros((), dtype=torch.float64, device=device)


def _squared_norm(shards: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squares of every element of ``shards``, as a float64 scalar on ``device``.

    Per-shard norms come from one ``torch._foreach_norm`` on the shards' own device (no host
    sync, no full-size temporary); their squares are summed in float64. Shards on the host (an
    offloaded optimizer) are summed there and the scalar is copied to ``device`` explicitly."""
    import torch

    total = torch.zeros((), dtype=torch.float64, device=device)
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for g in shards:
        by_device.setdefault(g.device, []).append(g)
    for where, group in by_device.items():
        norms = torch._foreach_norm(group)
        part = torch.stack(norms).double().square().sum()
        total += part if where == device else part.to(device)
    return total


@dataclass
class StrategyContext:
    """Everything a strategy needs, handed over by the engine at construction."""

    module: torch.nn.Module
    # torch-style parameter groups: [{"params": [...named in ``param_names``], "lr": ..., ...}],
    # each with its ds.zero.param_groups.GroupMeta (read with group_meta; hyper_params drops it)
    param_groups: list[dict[str, Any]]
    param_names: dict[int, str]  # id(param) -> qualified name in ``module``
    config: ResolvedConfig
    # Builds the optimizer over the strategy's own tensors. Given groups shaped like
    # ``param_groups`` (hyper-parameters kept, "params" replaced), it returns a torch optimizer.
    optimizer_factory: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]
    comm: Communicator | None = None  # None: one process, nothing to reduce
    group: Any = None  # the data-parallel process group (None: the world)
    rank: int = 0
    world_size: int = 1
    kernels: KernelProvider | None = None  # needed for offload_optimizer.device="cpu"
    device: Any = "cpu"
    stats: CommStats | None = None  # collects time spent in collectives for telemetry
    # Pins offloaded host buffers when the model lives on a device with pinned-memory copies.
    accelerator: Accelerator | None = None
    # Tensor parallelism: the group whose ranks hold different slices of the same weights.
    tp_group: Any = None
    tp_size: int = 1
    # Pipeline parallelism: the group linking this rank to the same coordinates on every stage;
    # the global norm adds the stages' squares over it.
    pp_group: Any = None


@dataclass(frozen=True)
class StepReport:
    overflow: bool
    grad_norm: float | None  # None when neither clipping nor reporting needed it


@dataclass
class MemoryReport:
    """Bytes this rank holds for training state (by construction, not measured)."""

    optimizer_state_bytes: int = 0
    gradient_bytes: int = 0
    master_weight_bytes: int = 0
    parameter_bytes: int = 0
    details: dict[str, int] = field(default_factory=dict)


class ZeroStrategy(abc.ABC):
    """A ZeRO stage: where training state lives and how it is reduced, stepped and gathered."""

    stage: ClassVar[int]

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx

    # -- the optimizer the engine and LR schedulers see ------------------------------------------
    @property
    @abc.abstractmethod
    def optimizer(self) -> torch.optim.Optimizer: ...

    # -- backward --------------------------------------------------------------------------------
    @abc.abstractmethod
    def begin_micro_step(self, boundary: bool, no_sync: bool = False) -> None:
        """Called before each backward. ``boundary``: this micro-step ends an accumulation window
        (gradients must be fully reduced when ``end_backward`` returns). ``no_sync``: no
        communication (``engine.no_sync()``, ``engine.coalesce_grad_reduction()``); gradients
        accumulate locally, unreduced, until the next synchronised backward or
        :meth:`reduce_deferred`. Between boundaries a stage may reduce early (stage 2 does, to
        keep only its partition) or accumulate locally (stages 0-1)."""

    @abc.abstractmethod
    def end_backward(self) -> None:
        """Called after each backward: launch what is left and wait for every reduction."""

    def reduce_deferred(self) -> None:  # noqa: B027 - a stage that never defers has nothing to do
        """Reduce what backward passes without communication left accumulated locally, as one
        boundary reduction, and wait for it; nothing when no such gradients are pending. The
        engine calls it, on every rank, where a window ends (``step()``, the end of
        ``coalesce_grad_reduction()``)."""

    # -- step ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def local_grad_shards(self) -> Sequence[torch.Tensor]:
        """The reduced gradients this rank holds (its partitions, or everything at stage 0)."""

    def tp_sliced(self) -> Sequence[bool]:
        """Per entry of :meth:`local_grad_shards`: True when it holds tensor-parallel slices."""
        return [False] * len(self.local_grad_shards())

    def pp_replicas(self) -> Sequence[bool]:
        """Per entry of :meth:`local_grad_shards`: True when it holds tied weights an earlier
        pipeline stage counts (left out of the norm, still clipped)."""
        return [False] * len(self.local_grad_shards())

    def replica_weights(self) -> Sequence[float] | None:
        """Per entry of :meth:`local_grad_shards`, the factor its squared norm is added with
        when some entries hold parameters only a subset of the ranks has (experts); None when
        every parameter is replicated over (or partitioned across) all data-parallel ranks."""
        return None

    @property
    def grads_partitioned(self) -> bool:
        """True when ranks hold disjoint gradient shards (norms and overflow need a reduction)."""
        return self.stage >= 1

    def prepare_step(self, loss_scale: float, clip: float, check_overflow: bool) -> StepReport:
        """Unscale gradients, detect overflow on any rank, compute the global norm and clip."""

        from ds.interfaces.comm import ReduceOp

        every = list(self.local_grad_shards())
        shards = [g for g in every if g.numel()]
        device = self._norm_device(shards)
        pp = self.ctx.pp_group is not None and self.ctx.comm is not None
        counted = [not r for r in self.pp_replicas()] if pp else [True] * len(every)
        tp = self.ctx.tp_group is not None and self.ctx.tp_size > 1 and self.ctx.comm is not None
        weights = self.replica_weights()
        if tp and weights is not None:
            # Experts folded onto TP (marked sliced: they differ across TP ranks) and dense
            # parameters, each with its data-parallel share (see the branch below).
            flags = list(self.tp_sliced())
            sq = torch_zero(device)
            for g, f, c, w in zip(every, flags, counted, weights, strict=True):
                if c and g.numel():
                    sq = sq + _squared_norm([g], device) * (w if f else w / self.ctx.tp_size)
        elif tp:
            # Replicated parameters are identical on every tensor-parallel rank: each adds
            # 1/tp of their square so that the sum over the group counts them once, and every
            # slice once.
            flags = list(self.tp_sliced())
            both = list(zip(every, flags, counted, strict=True))
            rep = [g for g, f, c in both if not f and c and g.numel()]
            sliced = [g for g, f, c in both if f and c and g.numel()]
            sq = _squared_norm(rep, device) / self.ctx.tp_size + _squared_norm(sliced, device)
        else:
            sq = _squared_norm([g for g, c in zip(every, counted, strict=True) if c and g.numel()], device)
        if weights is not None and not tp:
            # Expert shards differ across ranks: every rank adds its share and the sum over
            # the world counts each parameter once, whatever the stage.
            sq = torch_zero(device)
            for g, w in zip(every, weights, strict=True):
                if g.numel():
                    sq = sq + _squared_norm([g], device) * w
        # One float64 reduction carries the squared norm; inf/nan in any rank's gradients makes
        # the sum non-finite everywhere, which is the cross-rank overflow signal.
        partitioned = self.grads_partitioned or weights is not None
        if partitioned and self.ctx.comm is not None and self.ctx.world_size > 1:
            self._timed(lambda: self.ctx.comm.all_reduce(sq, op=ReduceOp.SUM, group=self.ctx.group))  # type: ignore[union-attr]
        if tp:
            self._timed(lambda: self.ctx.comm.all_reduce(sq, op=ReduceOp.SUM, group=self.ctx.tp_group))  # type: ignore[union-attr]
        if pp:
            self._timed(lambda: self.ctx.comm.all_reduce(sq, op=ReduceOp.SUM, group=self.ctx.pp_group))  # type: ignore[union-attr]
        # The step's one host sync: overflow skips the step, and the norm is reported.
        total = float(sq)
        overflow = not math.isfinite(total)
        if overflow and not check_overflow:
            overflow = False
        if overflow:
            return StepReport(True, None)
        norm = math.sqrt(total) / loss_scale
        factor = 1.0 / loss_scale
        if clip > 0.0 and norm > clip:
            factor *= clip / (norm + 1e-6)
        if factor != 1.0:
            for g in shards:
                g.mul_(factor)
        return StepReport(False, norm)

    def _norm_device(self, shards: Sequence[torch.Tensor]) -> torch.device:
        """Where the squared norm is summed and reduced: the model's device (the communicator's,
        on every backend), whatever device the gradient shards live on."""
        import torch

        device = self.ctx.device
        if device is None:
            return shards[0].device if shards else torch.device("cpu")
        return torch.device(device)

    @abc.abstractmethod
    def step(self) -> None:
        """Run the optimizer on this rank's partition and make the module's weights current."""

    def synchronize_parameters(self) -> None:  # noqa: B027 - optional hook
        """Wait until the module's parameters hold the last step's values.

        A stage may leave the parameter all-gather in flight when ``step`` returns and complete it
        lazily (forward pre-hooks, ``state_dict``); this completes it now."""

    @abc.abstractmethod
    def zero_grad(self) -> None: ...

    # -- checkpoints -----------------------------------------------------------------------------
    @abc.abstractmethod
    def state_dict(self) -> ShardedStateDict: ...

    @abc.abstractmethod
    def load_requests(self, metadata: dict[str, TensorMeta]) -> list[LoadRequest]: ...

    @abc.abstractmethod
    def load_state_dict(self, state: ShardedStateDict) -> None: ...

    # -- introspection ---------------------------------------------------------------------------
    @abc.abstractmethod
    def memory_report(self) -> MemoryReport: ...

    def release(self) -> None:  # noqa: B027 - optional hook
        """Remove hooks and free buffers (engine teardown)."""

    def empty_partition_cache(self) -> None:  # noqa: B027 - optional hook
        """Drop every gathered parameter this stage keeps whole between passes (stage 3's
        persistent ones); stages that keep none have nothing to do."""

    def _timed(self, fn: Callable[[], Any]) -> Any:
        stats = self.ctx.stats
        if stats is None:
            return fn()
        return stats.time(fn)
