"""The training engine: micro-steps, accumulation, precision, clipping, schedules, checkpoints.

Where state lives and how it moves between ranks is the business of the ZeRO stage strategy
(:mod:`ds.zero.stages`); the engine drives it the same way at every stage.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Container, Iterable, Iterator
from typing import Any

import torch

from ds.interfaces.accelerator import Accelerator
from ds.interfaces.comm import Communicator
from ds.interfaces.errors import ConfigError
from ds.interfaces.kernels import KernelProvider
from ds.interfaces.logging import get_logger
from ds.interfaces.moe import replica_group
from ds.interfaces.parallel import ParallelMesh, tp_dim
from ds.interfaces.telemetry import EventBus, StepMetrics
from ds.zero import engine_checkpoint, engine_export
from ds.zero.comm_stats import CommStats
from ds.zero.config import DsConfig, ResolvedConfig, load_config, resolve
from ds.zero.config.load import ConfigSource
from ds.zero.dataloader import ShardedLoader
from ds.zero.engine_telemetry import StepTelemetry, log_step
from ds.zero.loss_scaler import DynamicLossScaler, LossScaler
from ds.zero.lr_schedules import build_schedule
from ds.zero.optim.build import ClientOptimizer, OptimizerFactory
from ds.zero.param_groups import engine_param_groups
from ds.zero.stages.base import StrategyContext, ZeroStrategy
from ds.zero.stages.select import strategy_class
from ds.zero.timers import StepTimers

log = get_logger(__name__)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ZeroEngine:
    """Implements :class:`ds.interfaces.training.TrainingEngine` for ZeRO stages 0-3."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: ConfigSource,
        *,
        comm: Communicator | None = None,
        group: Any = None,
        kernels: KernelProvider | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_engine: Any = None,
        optimizer: ClientOptimizer | None = None,
        lr_scheduler: Any = None,
        model_parameters: Iterable[Any] | None = None,
        training_data: Any = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        events: EventBus | None = None,
        dist_init_required: bool | None = None,
        mesh: ParallelMesh | None = None,
    ) -> None:
        t0 = time.perf_counter()
        cfg: DsConfig = load_config(config)
        distributed = comm is not None and comm.is_initialized()
        self.comm = comm if distributed else None
        # With a mesh, ZeRO reduces and partitions over the data x sequence parallel ranks only
        # (see ds.interfaces.parallel); batch sizes count the data-parallel ranks.
        self.mesh = mesh if distributed else None
        if self.mesh is not None:
            if group is not None:
                raise ConfigError("pass either group= or mesh= to the engine, not both")
            group = self.mesh.group("dp_sp")
        tp, sp = cfg.model_parallel_sizes()
        have = (self.mesh.shape.tp, self.mesh.shape.sp) if self.mesh is not None else (1, 1)
        if (tp, sp) != have:
            raise ConfigError(
                f"the config asks for tensor_parallel.autotp_size={tp} and "
                f"sequence_parallel_size={sp} but the engine got a mesh of tp={have[0]}, "
                f"sp={have[1]}; build it with ds.full.initialize (which builds the mesh and "
                "applies AutoTP/Ulysses from the config) or pass a matching mesh="
            )
        self.group = group
        self.rank = comm.get_rank(group) if distributed and comm else 0
        self.world_size = comm.get_world_size(group) if distributed and comm else 1
        self.dp_size = self.mesh.shape.dp if self.mesh is not None else self.world_size
        self.config: ResolvedConfig = resolve(cfg, self.dp_size, hidden_size=_hidden_size(model))
        self.ds_config = cfg
        self.events = events or EventBus()
        self.checkpoint_engine = checkpoint_engine
        self.kernels = kernels
        self.accelerator = accelerator
        # Device-event timings only when asked for (reading events is a sync on some devices).
        self.timers = StepTimers(accelerator, device_times=bool(cfg.wall_clock_breakdown))
        self.comm_stats = CommStats()

        precision = cfg.precision
        if precision != "fp32":
            _cast_floating(model, _DTYPES[precision])
        self.module = model
        self._broadcast_module()

        offload = self.config.zero.offload_optimizer_device == "cpu"
        factory = OptimizerFactory(cfg.optimizer, optimizer, offload, kernels)
        # _group_origin: which of the user's parameter groups each engine group came from.
        split, self._group_origin = engine_param_groups(
            model, model_parameters, mesh, self.config.stage
        )
        groups = factory.initial_groups(split)
        names = {id(p): n for n, p in model.named_parameters()}
        ctx = StrategyContext(
            module=model,
            param_groups=groups,
            param_names=names,
            config=self.config,
            optimizer_factory=factory,
            comm=self.comm,
            group=group,
            rank=self.rank,
            world_size=self.world_size,
            kernels=kernels,
            device=_device_of(model),
            stats=self.comm_stats,
            accelerator=accelerator,
            tp_group=self.mesh.group("tp") if self.mesh and self.mesh.shape.tp > 1 else None,
            tp_size=self.mesh.shape.tp if self.mesh else 1,
            pp_group=self.mesh.group("pp") if self.mesh and self.mesh.shape.pp > 1 else None,
        )
        self.strategy: ZeroStrategy = strategy_class(self.config.stage)(ctx)
        self.optimizer = self.strategy.optimizer

        self.lr_scheduler = self._build_scheduler(lr_scheduler)
        self.loss_scaler = _loss_scaler(cfg)
        self.training_dataloader = (
            self.deepspeed_io(training_data, collate_fn=collate_fn)
            if training_data is not None
            else None
        )

        # Monitors (csv_monitor, tensorboard, wandb, comet) subscribe to ``events``; the
        # composition root builds them from the config (ds-monitor).
        self.monitor: Any = None
        self.telemetry = StepTelemetry(accelerator)
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._no_sync = False
        self._last_metrics: StepMetrics | None = None
        self.init_time_s = time.perf_counter() - t0
        if self.rank == 0:
            log.info(
                "engine ready",
                stage=self.config.stage,
                precision=precision,
                world_size=self.world_size,
                train_batch_size=self.config.train_batch_size,
                micro_batch=self.config.train_micro_batch_size_per_gpu,
                gradient_accumulation_steps=self.config.gradient_accumulation_steps,
                mesh=(
                    f"dp={mesh.shape.dp} sp={mesh.shape.sp} tp={mesh.shape.tp}"
                    if self.mesh is not None
                    else None
                ),
                init_s=round(self.init_time_s, 3),
            )

    # -- construction helpers --------------------------------------------------------------------
    def _broadcast_module(self) -> None:
        # Ranks must start from identical weights; rank 0's initialisation wins (as in DDP).
        if self.comm is None:
            return
        # ``src`` is a global rank: the first rank of the reduction group (rank 0 without a mesh).
        src = self.mesh.ranks("dp_sp")[0] if self.mesh is not None else 0
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                replicas = replica_group(t)
                if replicas is None:
                    self.comm.broadcast(t.data, src=src, group=self.group)
                elif replicas.size > 1:  # an expert: only its replica group holds it
                    self.comm.broadcast(t.data, src=replicas.ranks[0], group=replicas.group)
            if self.mesh is not None and self.mesh.shape.tp > 1:
                # Replicated parameters must also agree across the tensor-parallel ranks.
                tp_src = self.mesh.ranks("tp")[0]
                for t in list(self.module.parameters()) + list(self.module.buffers()):
                    if tp_dim(t) is None:
                        self.comm.broadcast(t.data, src=tp_src, group=self.mesh.group("tp"))

    def _build_scheduler(self, client: Any) -> Any:
        cfg = self.ds_config.scheduler
        if client is not None and cfg is not None:
            raise ConfigError(
                "both config.scheduler and an lr_scheduler passed to initialize(); remove one"
            )
        if client is not None:
            if callable(client) and not hasattr(client, "step"):
                return client(self.optimizer)
            return client
        if cfg is None:
            return None
        params = cfg.resolved_params()
        autos = [k for k, v in params.items() if v == "auto"]
        if autos:
            raise ConfigError(
                f"scheduler.params {', '.join(autos)} are 'auto' but nothing filled them; set numbers"
            )
        return build_schedule(cfg.type, self.optimizer, params)

    # -- moving states off the device between phases (DeepSpeed's API) ---------------------------
    def offload_states(
        self,
        include: Container[Any] | None = None,
        device: Any = "cpu",
        pin_memory: bool = True,
        non_blocking: bool = False,
    ) -> None:
        """Move the ``include``d states (``OffloadStateTypeEnum``; all when None) to host memory
        until :meth:`reload_states` (see :mod:`ds.zero.offload_states`)."""
        from ds.zero.offload_states import StateOffloader

        if not hasattr(self, "_state_offloader"):
            self._state_offloader = StateOffloader()
        self._state_offloader.offload(self, include, device, pin_memory, non_blocking)

    def reload_states(self, non_blocking: bool = False) -> None:
        """Bring back what :meth:`offload_states` moved (nothing when nothing was moved)."""
        if hasattr(self, "_state_offloader"):
            self._state_offloader.reload(non_blocking)

    # -- accessors -------------------------------------------------------------------------------
    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.config.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self.config.stage

    def zero_offload_optimizer(self) -> bool:
        return self.config.zero.offload_optimizer_device != "none"

    def gradient_clipping(self) -> float:
        return self.config.gradient_clipping

    def fp16_enabled(self) -> bool:
        return self.config.precision == "fp16"

    def bfloat16_enabled(self) -> bool:
        return self.config.precision == "bf16"

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def optimizer_view(self) -> torch.optim.Optimizer:
        """An optimizer a training framework can hold: the engine optimizer's groups and state,
        with ``step``/``zero_grad`` left to the engine (see :mod:`ds.zero.optimizer_view`)."""
        from ds.zero.optimizer_view import EngineOptimizerView

        return EngineOptimizerView(self)

    def get_global_grad_norm(self) -> float | None:
        return self._last_metrics.grad_norm if self._last_metrics else None

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    @property
    def last_metrics(self) -> StepMetrics | None:
        return self._last_metrics

    def memory_report(self) -> Any:
        return self.strategy.memory_report()

    # -- DeepSpeed's engine attribute names (scripts written for DeepSpeed read these) -----------
    @property
    def global_rank(self) -> int:
        return self.rank

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine (the launcher's ``LOCAL_RANK``)."""
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def dp_world_size(self) -> int:
        return self.dp_size  # the ranks that see different samples (the mesh's dp dimension)

    @property
    def device(self) -> torch.device:
        if self.accelerator is not None:
            return torch.device(self.accelerator.current_device_name())
        return _device_of(self.module)

    def was_step_applied(self) -> bool:
        """Whether the latest ``step()`` updated the parameters: False between accumulation
        boundaries and when an fp16 overflow skipped the step (as in DeepSpeed)."""
        if self._last_metrics is None or self.global_steps == 0:
            return False
        at_boundary = self.micro_steps % self.config.gradient_accumulation_steps == 0
        return at_boundary and not self._last_metrics.overflow

    def get_mom(self) -> list[Any]:
        """Per group: ``betas`` (Adam-like optimizers) or ``momentum`` (SGD), as in DeepSpeed."""
        key = "betas" if any("betas" in g for g in self.optimizer.param_groups) else "momentum"
        return [g.get(key, 0.0) for g in self.optimizer.param_groups]

    def steps_per_print(self) -> int | None:
        return self.ds_config.steps_per_print

    def save_fp16_model(self, save_dir: str, save_filename: str = "pytorch_model.bin") -> bool:
        """DeepSpeed's older name of :meth:`save_16bit_model`."""
        return self.save_16bit_model(save_dir, save_filename)

    # -- module pass-throughs (DeepSpeed's engine is used like the module it wraps) --------------
    def train(self, mode: bool = True) -> ZeroEngine:
        self.module.train(mode)
        return self

    def eval(self) -> ZeroEngine:
        self.module.eval()
        return self

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        self.strategy.synchronize_parameters()
        return self.module.parameters(recurse)

    def named_parameters(
        self, *args: Any, **kwargs: Any
    ) -> Iterator[tuple[str, torch.nn.Parameter]]:
        self.strategy.synchronize_parameters()
        return self.module.named_parameters(*args, **kwargs)

    def module_state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def synchronize_parameters(self) -> None:
        """Complete the parameter all-gather that stages 1-2 leave in flight after ``step``.

        Forward passes, ``module.state_dict()``, checkpoints and this engine's parameter accessors
        do it themselves; call it before reading parameter tensors any other way."""
        self.strategy.synchronize_parameters()

    def zero_grad(self) -> None:
        """Drop accumulated gradients (``step`` does this at every boundary)."""
        self.strategy.zero_grad()

    # -- the training step -----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.timers.start("forward")
        self.telemetry.count_tokens(args, kwargs)
        out = self.module(*args, **kwargs)
        self.timers.stop("forward")
        return out

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.config.gradient_accumulation_steps == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Make the next micro-step end (or not end) an accumulation window. For training loops
        that decide the window themselves (a framework steps on an epoch's last batch, or after
        resuming mid-window): the micro-step counter moves so the engine's boundary falls on the
        loop's."""
        if self.is_gradient_accumulation_boundary() == is_boundary:
            return
        gas = self.config.gradient_accumulation_steps
        if is_boundary:
            self.micro_steps = (self.micro_steps // gas + 1) * gas - 1
        else:
            self.micro_steps += 1

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally without communication."""
        previous, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = previous

    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> None:
        """``scale_wrt_gas=False`` (DeepSpeed's keyword; transformers passes it when its loss is
        already averaged over the accumulation window) leaves the loss undivided by the
        accumulation steps."""
        self.timers.start("backward")
        self.strategy.begin_micro_step(self.is_gradient_accumulation_boundary(), self._no_sync)
        gas = self.config.gradient_accumulation_steps if scale_wrt_gas else 1
        scale = self.loss_scaler.loss_scale / gas
        scaled = loss.float() * scale if scale != 1.0 else loss
        scaled.backward(retain_graph=retain_graph)
        self.strategy.end_backward()
        self.telemetry.add_loss(loss)
        self.timers.stop("backward")

    def step(self, lr_kwargs: dict[str, Any] | None = None) -> None:
        if not self.is_gradient_accumulation_boundary():
            self.micro_steps += 1
            return
        self.timers.start("step")
        self.telemetry.stage_loss()
        fp16 = self.config.precision == "fp16"
        check = fp16 or (
            self.config.precision == "bf16" and self.ds_config.bf16.check_grad_overflow
        )
        report = self.strategy.prepare_step(
            self.loss_scaler.loss_scale, self.config.gradient_clipping, check
        )
        if report.overflow:
            self.skipped_steps += 1
            if self.rank == 0:
                log.info(
                    "overflow: step skipped",
                    step=self.global_steps,
                    loss_scale=self.loss_scaler.loss_scale,
                )
        else:
            self.strategy.step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))
        if fp16:
            self.loss_scaler.update(report.overflow)
        self.strategy.zero_grad()
        self.global_steps += 1
        self.global_samples += self.config.train_batch_size
        self.micro_steps += 1
        self.timers.stop("step")
        self._publish(report.overflow, report.grad_norm)

    def _step_extras(self) -> dict[str, Any]:
        """More StepMetrics fields for this step (the pipeline engine adds its own)."""
        return {}

    def _stage_loss(self) -> None:
        self.telemetry.stage_loss()

    def _take_loss(self) -> float | None:
        return self.telemetry.take_loss()

    def _publish(self, overflow: bool, grad_norm: float | None) -> None:
        self._last_metrics = self.telemetry.metrics(self, overflow, grad_norm)
        self.events.publish(self._last_metrics)
        log_step(self, self._last_metrics)

    # -- data ------------------------------------------------------------------------------------
    def deepspeed_io(
        self,
        dataset: Any,
        batch_size: int | None = None,
        *,
        shuffle: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
    ) -> ShardedLoader:
        # Ranks of one sequence- or tensor-parallel group read the same samples.
        dp_rank = self.mesh.index("dp") if self.mesh is not None else self.rank
        return ShardedLoader(
            dataset,
            batch_size or self.config.train_micro_batch_size_per_gpu,
            dp_rank,
            self.dp_size,
            shuffle=shuffle,
            seed=self.ds_config.seed or 0,
            drop_last=bool(self.ds_config.dataloader_drop_last),
            collate_fn=collate_fn,
            num_workers=num_workers,
        )

    # -- checkpoints (ds.zero.engine_checkpoint) and the exported model (ds.zero.engine_export) --
    def save_checkpoint(
        self,
        save_dir: str,
        tag: str | None = None,
        client_state: dict[str, Any] | None = None,
        *,
        exclude_frozen_parameters: bool = False,
    ) -> None:
        """``exclude_frozen_parameters``: DeepSpeed's keyword (transformers passes it for PEFT
        models, whose frozen base weights come from the pretrained files, not the checkpoint)."""
        engine_checkpoint.save_checkpoint(
            self, save_dir, tag, client_state, exclude_frozen_parameters
        )

    def load_checkpoint(
        self,
        load_dir: str,
        tag: str | None = None,
        *,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_strict: bool = True,
        load_module_only: bool = False,
    ) -> tuple[str | None, dict[str, Any]]:
        """DeepSpeed's keywords: loads are always strict (every parameter must be found);
        ``load_module_only`` leaves the optimizer and schedule as they are."""
        if load_module_only:
            load_optimizer_states = load_lr_scheduler_states = False
        return engine_checkpoint.load_checkpoint(
            self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states
        )

    def save_16bit_model(self, save_dir: str, save_filename: str = "pytorch_model.bin") -> bool:
        """Write the whole module's weights, in the model dtype, to ``save_dir/save_filename``
        (``torch.save`` of a state dict, or safetensors for a ``.safetensors`` name; rank 0
        writes). With tensor parallelism the slices are reassembled first (every rank calls
        it). At stage 3 every rank must call it (it gathers one parameter at a time) and it
        needs ``stage3_gather_16bit_weights_on_model_save``; without it nothing is written and
        the result is False."""
        return engine_export.save_16bit_model(self, save_dir, save_filename)

    def destroy(self) -> None:
        self.strategy.release()


def _hidden_size(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for attr in ("hidden_size", "d_model", "n_embd"):
        value = getattr(config, attr, None) or getattr(model, attr, None)
        if isinstance(value, int):
            return value
    return None


def _device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _loss_scaler(cfg: DsConfig) -> LossScaler:
    fp16 = cfg.fp16
    if cfg.precision != "fp16":
        return LossScaler(1.0)
    if fp16.loss_scale > 0:
        return LossScaler(fp16.loss_scale)
    return DynamicLossScaler(
        init_scale=2.0**fp16.initial_scale_power,
        scale_window=fp16.loss_scale_window,
        min_scale=fp16.min_loss_scale,
        hysteresis=fp16.hysteresis,
        consecutive_hysteresis=fp16.consecutive_hysteresis,
    )


def _cast_floating(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)`` that keeps each tensor object and its attributes.

    ``Module.to`` swaps whole tensor objects for tensor subclasses (fake and distributed
    tensors), which drops attributes such as the stage-3 shard state ``ds.zero.Init`` attached;
    assigning ``.data`` keeps them for every tensor type.
    """
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point() and t.dtype != dtype:
                t.data = t.data.to(dtype)
