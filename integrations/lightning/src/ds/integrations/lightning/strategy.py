"""A Lightning Trainer strategy that trains on the ds engine (ZeRO stages 1-3, CPU offload).

Lightning keeps process launching, the process group, data sharding and loops (everything from
DDPStrategy); the engine replaces DDP's gradient averaging and the optimizer step. Lightning's
automatic optimisation divides the loss by ``accumulate_grad_batches`` and calls the optimizer only
at accumulation boundaries; the engine, created with the same accumulation count, is handed the
undivided loss in ``backward`` and steps itself at its boundaries, so the proxy optimizer's
``step`` only runs Lightning's closure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ds.integrations.lightning._engine import (
    EngineOptions,
    consolidated_state_dict,
    initializer,
    rebind_scheduler,
)
from ds.interfaces.errors import ConfigError
from ds.interfaces.logging import get_logger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

log = get_logger(__name__)


class ModuleWrapper(torch.nn.Module):
    """The module the engine owns: calling it calls the LightningModule, whose ``forward`` Lightning
    redirects to ``training_step``/``validation_step`` around the call, so engine hooks on the root
    module run for every step."""

    def __init__(self, forward_module: torch.nn.Module) -> None:
        super().__init__()
        self.forward_module = forward_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_module(*args, **kwargs)


class DsStrategy(EngineOptions, DDPStrategy):
    """``Trainer(strategy=DsStrategy(stage=3))`` or a registered name (``"ds_zero3"``).

    ``config`` (a DeepSpeed-style dict) overrides anything derived from the arguments and the
    Trainer; ``micro_batch_size`` only feeds the engine's sample counters.
    """

    strategy_name = "ds"
    # Per-instance once set: the Trainer's accumulation count (in setup) and whether the optimizer
    # step is running (the engine's accumulation boundary).
    _gas = 1
    _stepping = False

    # -- setup -----------------------------------------------------------------------------------
    def setup(self, trainer: Any) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        assert self.model is not None
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self._build_engine(trainer)
        self.setup_precision_plugin()

    def _build_engine(self, trainer: Any) -> None:
        from lightning.pytorch.core.optimizer import _MockOptimizer

        if len(self.optimizers) != 1:
            raise ConfigError(
                f"configure_optimizers() returned {len(self.optimizers)} optimizers; the ds "
                "strategies train with exactly one"
            )
        self._gas = int(trainer.accumulate_grad_batches)
        cfg = self.engine_config(
            self._gas, trainer.gradient_clip_val, str(self.precision_plugin.precision)
        )
        # configure_optimizers() may return None when the config has an 'optimizer' section;
        # Lightning then hands over a placeholder.
        client = None if isinstance(self.optimizers[0], _MockOptimizer) else self.optimizers[0]
        if client is not None and "optimizer" in cfg:
            raise ConfigError(
                "both configure_optimizers() and config['optimizer'] define the optimizer; "
                "return None from configure_optimizers() or drop the config section"
            )
        if client is None and "optimizer" not in cfg:
            raise ConfigError(
                "configure_optimizers() returned no optimizer and the strategy config has no "
                "'optimizer' section; define one of them"
            )
        if self.engine is not None:  # a second fit() on the same strategy starts afresh
            self.engine.destroy()
        assert self.lightning_module is not None
        wrapper = ModuleWrapper(self.lightning_module)
        engine, optimizer, _, _ = initializer()(model=wrapper, optimizer=client, config=cfg)
        self.engine = engine
        for lr_config in self.lr_scheduler_configs:
            rebind_scheduler(lr_config.scheduler, client, optimizer)
        self.model = wrapper
        self.optimizers = [engine.optimizer_view()]

    # -- the step ------------------------------------------------------------------------------------
    def backward(
        self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        assert self.lightning_module is not None
        if self.engine is None:
            raise ConfigError("backward() outside fit(): the ds engine is built when fitting")
        self.engine.set_gradient_accumulation_boundary(self._stepping)
        closure_loss = self.precision_plugin.pre_backward(closure_loss, self.lightning_module)
        # Lightning already divided by accumulate_grad_batches; the engine divides again.
        self.engine.backward(closure_loss * self._gas)
        self.engine.step()
        return self.precision_plugin.post_backward(closure_loss, self.lightning_module)

    def optimizer_step(
        self,
        optimizer: Any,
        closure: Callable[[], Any],
        model: Any = None,
        **kwargs: Any,
    ) -> Any:
        # Lightning calls this only at the end of an accumulation window; the closure runs
        # training_step and backward, where the engine applies the step.
        self._stepping = True
        try:
            return closure()
        finally:
            self._stepping = False

    # -- checkpoints -----------------------------------------------------------------------------
    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # the engine must exist to receive its shards

    @property
    def lightning_restore_optimizer(self) -> bool:
        return False  # optimizer state travels in the engine's checkpoint

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}  # weights travel in the engine's checkpoint

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
    ) -> None:
        """Every rank writes its shards to the directory ``filepath``; Lightning's own state
        (loops, callbacks, schedulers, hyper-parameters) rides along as client state."""
        if self.engine is None:
            raise ConfigError("save_checkpoint() before fit(): the ds engine does not exist yet")
        client = {
            k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")
        }
        self.engine.save_checkpoint(str(filepath), tag="checkpoint", client_state=client)

    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if self.engine is None:
            raise ConfigError("load_checkpoint() before fit(): the ds engine does not exist yet")
        path, client = self.engine.load_checkpoint(str(checkpoint_path), tag="checkpoint")
        if path is None:
            raise ConfigError(f"no ds checkpoint in {checkpoint_path}; pass a directory it wrote")
        return dict(client)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        return None  # already restored by load_checkpoint

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        return None

    def remove_checkpoint(self, filepath: Any) -> None:
        import shutil

        if self.is_global_zero:
            shutil.rmtree(str(filepath), ignore_errors=True)

    def consolidated_state_dict(self) -> dict[str, torch.Tensor]:
        """The LightningModule's whole weights (every rank must call it under stage 3)."""
        sd = consolidated_state_dict(self.engine)
        prefix = "forward_module."
        return {k.removeprefix(prefix): v for k, v in sd.items()}
