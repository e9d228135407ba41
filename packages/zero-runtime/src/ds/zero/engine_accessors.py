"""The engine's surface besides the step and checkpoints: the config's getters, DeepSpeed's
engine attribute names (scripts written for DeepSpeed read these), the module pass-throughs and
moving states off the device between phases."""

from __future__ import annotations

import os
from collections.abc import Container, Iterator
from typing import Any, TypeVar

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.telemetry import StepMetrics
from ds.zero.config import DsConfig, ResolvedConfig
from ds.zero.engine_setup import device_of

_E = TypeVar("_E", bound="EngineAccessors")


class EngineAccessors:
    """Mixed into :class:`ds.zero.engine.ZeroEngine`; reads the attributes it sets."""

    config: ResolvedConfig
    ds_config: DsConfig
    module: torch.nn.Module
    optimizer: Any
    strategy: Any
    accelerator: Any
    loss_scaler: Any
    rank: int
    dp_size: int
    global_steps: int
    micro_steps: int
    _last_metrics: StepMetrics | None

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

    def empty_partition_cache(self) -> None:
        """Free the parameters ZeRO-3 keeps gathered between passes (the persistent small ones),
        e.g. before handing the device to another job; the next forward gathers them again.
        Nothing to do at stages 0-2."""
        self.strategy.empty_partition_cache()
        if self.accelerator is not None:
            self.accelerator.empty_cache()

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

    @property
    def _config(self) -> ResolvedConfig:
        """DeepSpeed's name for the engine's config; its getters below read it."""
        return self.config

    def gradient_clipping(self) -> float:
        return float(self._config.gradient_clipping)

    def log_level(self) -> str | None:
        """The config's ``log_level`` (None: the library loggers' level was left alone)."""
        level: str | None = self._config.log_level
        return level

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return bool(self.config.zero.gather_16bit_weights_on_model_save)

    def _zero3_consolidated_16bit_state_dict(
        self, exclude_frozen_parameters: bool = False
    ) -> dict[str, torch.Tensor]:
        """DeepSpeed's name for the whole weights in the model dtype, gathered one parameter at a
        time (every rank must call it); accelerate's ``get_state_dict`` and so the Trainer's
        ``save_model`` call it at stage 3. Every rank gets the dict (DeepSpeed: rank 0)."""
        gather = getattr(self.strategy, "consolidated_state_dict", None)
        if gather is None:
            raise ConfigError(
                f"_zero3_consolidated_16bit_state_dict is for ZeRO stage 3 (this engine runs stage "
                f"{self.config.stage}); read the whole weights with module.state_dict()"
            )
        weights: dict[str, torch.Tensor] = gather()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            weights = {k: v for k, v in weights.items() if k not in frozen}
        return weights

    def autotp_size(self) -> int:
        """The tensor-parallel size the engine runs (1 without a mesh)."""
        return self.mesh.shape.tp if self.mesh is not None else 1

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

    def _grad_norm_groups(self) -> list[torch.Tensor]:
        """The L2 norm of each optimizer group's gradient over the data-parallel ranks, as the
        step will read it (with fp16 still loss-scaled): DeepSpeed's ``_get_norm_groups``,
        which the engine's optimizer carries. A collective when gradients are partitioned."""
        strategy = self.strategy
        device = device_of(self.module)
        norms = []
        for shards in strategy.grad_shards_by_group():
            sq = torch.zeros((), dtype=torch.float64, device=device)
            for g in shards:
                sq += g.detach().double().pow(2).sum().to(device)
            if strategy.grads_partitioned and getattr(strategy.ctx, "comm", None) is not None:
                strategy.ctx.comm.all_reduce(sq, group=strategy.ctx.group)
            norms.append(sq.sqrt().float())
        return norms

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
        return device_of(self.module)

    def was_step_applied(self) -> bool:
        """Whether the latest ``step()`` updated the parameters: False between accumulation
        boundaries and when an fp16 overflow skipped the step (as in DeepSpeed). With
        ``managed_gradient_accumulation: false`` every step ends a window."""
        if self._last_metrics is None or self.global_steps == 0:
            return False
        gas = self.config.gradient_accumulation_steps
        at_boundary = not self.config.managed_gradient_accumulation or self.micro_steps % gas == 0
        return at_boundary and not self._last_metrics.overflow

    def get_mom(self) -> list[Any]:
        """Per group: ``betas`` (Adam-like optimizers) or ``momentum`` (SGD), as in DeepSpeed."""
        key = "betas" if any("betas" in g for g in self.optimizer.param_groups) else "momentum"
        return [g.get(key, 0.0) for g in self.optimizer.param_groups]

    def steps_per_print(self) -> int | None:
        return self.ds_config.steps_per_print

    # -- module pass-throughs (DeepSpeed's engine is used like the module it wraps) --------------
    def train(self: _E, mode: bool = True) -> _E:
        self.module.train(mode)
        return self

    def eval(self: _E) -> _E:
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
