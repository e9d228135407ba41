"""The training engine: micro-steps, accumulation, precision, clipping, schedules, checkpoints.

Where state lives and how it moves between ranks is the business of the ZeRO stage strategy
(:mod:`ds.zero.stages`); the engine drives it the same way at every stage. Beside it:
:mod:`~ds.zero.engine_setup` (construction), :mod:`~ds.zero.param_groups` (the strategy's
parameter groups), :mod:`~ds.zero.engine_telemetry` (loss staging, step metrics),
:mod:`~ds.zero.engine_checkpoint` and :mod:`~ds.zero.engine_export` (checkpoints, the whole
model's weights), :mod:`~ds.zero.engine_accessors` (getters, DeepSpeed's attribute names) and
:mod:`~ds.zero.engine_accumulation` (accumulation windows, ``no_sync``, coalesced reduction).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ds.interfaces.accelerator import Accelerator
from ds.interfaces.comm import Communicator
from ds.interfaces.errors import ConfigError
from ds.interfaces.kernels import KernelProvider
from ds.interfaces.logging import get_logger
from ds.interfaces.parallel import ParallelMesh
from ds.interfaces.telemetry import EventBus, StepMetrics
from ds.zero import engine_checkpoint, engine_export, optimizer_names, throughput
from ds.zero import engine_setup as setup
from ds.zero.comm_stats import CommStats
from ds.zero.config import DsConfig, ResolvedConfig, load_config, resolve
from ds.zero.config.load import ConfigSource
from ds.zero.dataloader import ShardedLoader
from ds.zero.engine_accessors import EngineAccessors
from ds.zero.engine_accumulation import EngineAccumulation, check_accumulation_mode
from ds.zero.engine_precision import EnginePrecision
from ds.zero.engine_telemetry import StepTelemetry, log_step
from ds.zero.optim.build import ClientOptimizer, OptimizerFactory
from ds.zero.optim.none import has_optimizer, missing
from ds.zero.param_groups import engine_param_groups
from ds.zero.stages.base import StrategyContext, ZeroStrategy
from ds.zero.stages.reduction import DirectBackwardError
from ds.zero.stages.select import strategy_class
from ds.zero.timers import StepTimers

log = get_logger(__name__)


class ZeroEngine(EngineAccumulation, EngineAccessors, EnginePrecision):
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
        setup.check_mesh(cfg, self.mesh)
        check_accumulation_mode(cfg, self.pipeline_parallelism)
        self.group = group
        self.rank = comm.get_rank(group) if distributed and comm else 0
        self.world_size = comm.get_world_size(group) if distributed and comm else 1
        self.dp_size = self.mesh.shape.dp if self.mesh is not None else self.world_size
        self.config: ResolvedConfig = resolve(
            cfg, self.dp_size, hidden_size=setup.hidden_size(model)
        )
        self.ds_config = cfg
        self.events = events or EventBus()
        self.checkpoint_engine = checkpoint_engine
        self.kernels = kernels
        self.accelerator = accelerator
        # Device-event timings only when asked for (reading events is a sync on some devices).
        self.timers = StepTimers(accelerator, device_times=bool(cfg.wall_clock_breakdown))
        self.comm_stats = CommStats()
        self.tput_timer = throughput.for_engine(self)  # DeepSpeed's samples/s: forward to step()

        setup.apply_log_level(cfg.log_level)
        self.module = model
        self._assert_valid_mixed_precision_config()
        # Parameters built under ds.zero.Init take the cast too: it keeps the tensor objects their
        # shards are attached to.
        self._cast_module_mixed_precision(*self._mixed_precision_dtypes(), False)
        setup.broadcast_module(self)

        offload = self.config.zero.offload_optimizer_device == "cpu"
        factory = OptimizerFactory(
            cfg.optimizer,
            optimizer,
            offload,
            kernels,
            force_host_optimizer=cfg.zero_force_ds_cpu_optimizer is not False,
            allow_untested=cfg.zero_allow_untested_optimizer or self.config.stage == 0,
        )
        # _group_origin: which of the user's parameter groups each engine group came from.
        split, self._group_origin = engine_param_groups(
            model, model_parameters, mesh, self.config.stage
        )
        names = {id(p): n for n, p in model.named_parameters()}
        # Each group's parameter names in order: a checkpoint records them so that a converter
        # can lay the tensors out as another framework's flat groups (ds.checkpoint.deepspeed_writer).
        self._group_param_names = [[names[id(p)] for p in g["params"]] for g in split]
        groups = factory.initial_groups(split, names)
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
            device=setup.device_of(model),
            stats=self.comm_stats,
            accelerator=accelerator,
            tp_group=self.mesh.group("tp") if self.mesh and self.mesh.shape.tp > 1 else None,
            tp_size=self.mesh.shape.tp if self.mesh else 1,
            pp_group=self.mesh.group("pp") if self.mesh and self.mesh.shape.pp > 1 else None,
        )
        self.strategy: ZeroStrategy = strategy_class(self.config.stage)(ctx)
        self.optimizer = self.strategy.optimizer

        self.lr_scheduler = setup.build_scheduler(cfg, lr_scheduler, self.optimizer)
        self.loss_scaler = setup.loss_scaler(cfg)
        optimizer_names.attach(self)  # DeepSpeed's names for the optimizer's training state
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
        self._init_accumulation()
        self._last_metrics: StepMetrics | None = None
        self.init_time_s = time.perf_counter() - t0
        if self.rank == 0:
            log.info(
                "engine ready",
                stage=self.config.stage,
                precision=cfg.precision,
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

    # -- the training step -----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.timers.start("forward")
        self.tput_timer.start()
        self.telemetry.count_tokens(args, kwargs)
        out = self.module(*args, **kwargs)
        self.timers.stop("forward")
        return out

    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> torch.Tensor:
        """``scale_wrt_gas=False`` (DeepSpeed's keyword; transformers passes it when its loss is
        already averaged over the accumulation window) leaves the loss undivided by the
        accumulation steps. Returns the loss divided by the accumulation steps (what the
        gradients are of, before loss scaling), as DeepSpeed does."""
        if not has_optimizer(self.optimizer):  # DeepSpeed refuses it too: nothing would use them
            raise missing("backward()")
        self.timers.start("backward")
        self._begin_backward()
        gas = self.config.gradient_accumulation_steps if scale_wrt_gas else 1
        scale = self.loss_scaler.loss_scale / gas
        scaled = loss.float() * scale if scale != 1.0 else loss
        scaled.backward(retain_graph=retain_graph)
        self.strategy.end_backward()
        self.telemetry.add_loss(loss)
        self.timers.stop("backward")
        return loss / gas if gas != 1 else loss

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``engine.scale(loss).backward()``: the loss to call ``backward()`` on by hand,
        multiplied by the loss scale and divided by the accumulation steps as ``backward()``
        does, so the gradients ``step()`` sees are the same. Stage 3 only: its gradients are
        reduced as each arrives and the end of the backward releases the parameters, whoever
        started it; at stages 0-2 the engine reduces around its own ``backward()`` and refuses
        one it does not run."""
        if not has_optimizer(self.optimizer):
            raise missing("scale()")
        if loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError(
                "engine.scale(loss): loss must be a scalar tensor with a grad_fn (computed "
                "from the engine's forward)"
            )
        if self.config.stage != 3:
            raise DirectBackwardError(
                f"engine.scale(loss).backward() is supported at ZeRO stage 3; at stage "
                f"{self.config.stage} the engine reduces gradients around its own backward: "
                "call engine.backward(loss)"
            )
        factor = self.loss_scaler.loss_scale / self.config.gradient_accumulation_steps
        return loss.float() * factor if factor != 1.0 else loss

    def step(self, lr_kwargs: dict[str, Any] | None = None) -> None:
        if not has_optimizer(self.optimizer):
            raise missing("step()")
        self._check_step()
        if not self._take_window_end():
            self.tput_timer.stop(global_step=False)
            self.micro_steps += 1
            return
        with self._window_end():  # reduces what backward passes left unreduced first
            self._update(lr_kwargs)

    def _update(self, lr_kwargs: dict[str, Any] | None) -> None:
        """The end of a window: unscale, check, clip and step (or skip on overflow)."""
        self.timers.start("step")
        self.telemetry.stage_loss()
        fp16 = self.config.precision == "fp16"
        check = fp16 or (
            self.config.precision == "bf16" and self.ds_config.bf16.check_grad_overflow
        )
        report = self.strategy.prepare_step(
            self.loss_scaler.loss_scale, self.config.gradient_clipping, check
        )
        self.optimizer._global_grad_norm = report.grad_norm
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
        samples = self._take_window_samples()
        self.global_samples += samples
        self.tput_timer.stop(global_step=True)
        self.micro_steps += 1
        self.timers.stop("step")
        self._publish(report.overflow, report.grad_norm, samples)

    def _step_extras(self) -> dict[str, Any]:
        """More StepMetrics fields for this step (the pipeline engine adds its own)."""
        return {}

    def _stage_loss(self) -> None:  # the two halves of the loss's read-back, for callers that
        self.telemetry.stage_loss()  # drive them apart (see StepTelemetry)

    def _take_loss(self) -> float | None:
        return self.telemetry.take_loss()

    def _publish(self, overflow: bool, grad_norm: float | None, samples: int) -> None:
        self._last_metrics = self.telemetry.metrics(self, overflow, grad_norm, samples)
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
        if not has_optimizer(self.optimizer):  # its stage holds no training state to save
            raise missing("save_checkpoint()", "save its weights with save_16bit_model()")
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
        if not has_optimizer(self.optimizer):
            raise missing("load_checkpoint()", "load weights into the model before initialize()")
        if load_module_only:
            load_optimizer_states = load_lr_scheduler_states = False
        return engine_checkpoint.load_checkpoint(
            self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states
        )

    def save_fp16_model(self, save_dir: str, save_filename: str = "pytorch_model.bin") -> bool:
        """DeepSpeed's older name of :meth:`save_16bit_model`."""
        return self.save_16bit_model(save_dir, save_filename)

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
