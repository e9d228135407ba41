"""``DsTrainer``: the Transformers ``Trainer`` training on the ds engine (ZeRO 0-3, offload).

The Trainer keeps what it is good at (data loading and sharding through accelerate, the loop,
logging, callbacks, the learning-rate schedule); the engine takes over gradient reduction,
accumulation, clipping, mixed precision and the optimizer step:

- ``create_optimizer`` builds the engine (through ``ds.full.initialize``) and hands the Trainer an
  optimizer proxy whose ``param_groups`` are the engine optimizer's, so the Trainer's scheduler sets
  the engine's learning rate, and whose ``step`` does nothing;
- ``_wrap_model`` returns a thin module around the engine (no ``no_sync``, so accelerate never adds
  DDP on top);
- ``training_step`` runs ``compute_loss``, ``engine.backward`` and ``engine.step`` with the engine's
  accumulation boundary kept on the Trainer's;
- ``save_model`` writes a normal Transformers checkpoint directory (weights gathered under ZeRO-3).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import Trainer

from ds.integrations.hf._registry import provided
from ds.integrations.hf.config import fill_auto, finalize_auto
from ds.integrations.hf.schedule import EngineSchedule
from ds.interfaces.errors import ConfigError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)


class EngineModule(torch.nn.Module):
    """What the Trainer calls during training: forwards to the engine. It deliberately has no
    ``no_sync``: the engine decides when gradients are reduced."""

    def __init__(self, engine: Any) -> None:
        super().__init__()
        self.engine = engine
        self.module = engine.module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        # The engine clears (or partitions away) gradients after each step.
        return None


class DsTrainer(Trainer):
    """``Trainer`` plus ``ds_config`` (a path, JSON string or dict in DeepSpeed's format; "auto"
    values are filled from ``TrainingArguments``). Start several processes with
    ``ds run --nproc N script.py``; accelerate shards the data, the engine shards the model."""

    def __init__(self, *args: Any, ds_config: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self.accelerator.state, "deepspeed_plugin", None) is not None:
            raise ConfigError(
                "DsTrainer runs the ds engine; TrainingArguments(deepspeed=...) also asks for "
                "DeepSpeed: remove the deepspeed argument and pass the config as ds_config="
            )
        self.ds_config = fill_auto(ds_config, self.args, self.args.world_size)
        self.engine: Any = None
        self._engine_view: Any = None  # engine.optimizer_view(), once the engine exists

    # -- engine construction ---------------------------------------------------------------------
    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self._finalize_config(num_training_steps)
        super().create_optimizer_and_scheduler(num_training_steps)

    def _finalize_config(self, num_training_steps: int | None = None) -> None:
        # transformers' second "auto" pass (trainer_config_finalize: step counts, bucket sizes),
        # before the engine is built; the Trainer knows max_steps by then (state.max_steps).
        steps = num_training_steps or int(getattr(self.state, "max_steps", 0) or 0)
        if steps > 0:
            self.ds_config = finalize_auto(self.ds_config, self.args, self.model, steps)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        if self.lr_scheduler is None and "scheduler" in self.ds_config:
            # The config's schedule, built and stepped by the engine (as DeepSpeed's engine does
            # under transformers), not the Trainer's lr_scheduler_type.
            if self.engine is None:
                self.create_optimizer()
            self.lr_scheduler = EngineSchedule(self.engine)
            return self.lr_scheduler
        return super().create_scheduler(num_training_steps, optimizer)

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        if self.engine is not None and self.optimizer is self._engine_view:
            return self.optimizer
        self._finalize_config()
        client = None
        if "optimizer" not in self.ds_config:
            # The Trainer's own optimizer (its decay / no-decay groups) is the engine's client.
            client = (
                self.optimizer if self.optimizer is not None else super().create_optimizer(model)
            )
            # As transformers does under DeepSpeed: the Trainer's optimizer is whatever the user
            # chose, and under optimizer offload it runs on ds's host kernels (Adam, AdamW,
            # Adagrad); a bare config refuses both, as DeepSpeed's engine does.
            self.ds_config.setdefault("zero_allow_untested_optimizer", True)
            self.ds_config.setdefault("zero_force_ds_cpu_optimizer", False)
        elif self.optimizer is not None:
            raise ConfigError(
                "both ds_config['optimizer'] and a Trainer optimizer (optimizers=...) are set; "
                "remove one"
            )
        initialize = provided("default")
        engine, _, _, _ = initialize(model=self.model, optimizer=client, config=self.ds_config)
        self.engine = engine
        self.optimizer = self._engine_view = engine.optimizer_view()
        return self.optimizer

    def _wrap_model(self, model: Any, training: bool = True, dataloader: Any = None) -> Any:
        if not training or self.engine is None:
            return super()._wrap_model(model, training, dataloader)
        if isinstance(model, EngineModule):
            return model
        return EngineModule(self.engine)

    # -- the step ------------------------------------------------------------------------------------
    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        if self.engine is None:
            return super().training_step(model, inputs, num_items_in_batch)
        engine = self.engine
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss: Any = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        gas = engine.gradient_accumulation_steps()
        if self.loss_is_scaled_for_ga is not None:
            scaled = bool(self.loss_is_scaled_for_ga)
        else:
            scaled = (
                self.model_accepts_loss_kwargs and num_items_in_batch is not None
            ) or self.compute_loss_func is not None
        self.engine.set_gradient_accumulation_boundary(bool(self.accelerator.sync_gradients))
        # The engine divides by its accumulation steps; a loss already normalised over the whole
        # accumulated batch must not be divided twice.
        engine.backward(loss * gas if scaled else loss)
        engine.step()
        reported: torch.Tensor = loss if scaled else loss / gas
        return reported.detach()

    def _clip_grad_norm(self, model: Any) -> Any:
        if self.engine is None:
            return super()._clip_grad_norm(model)  # type: ignore[no-untyped-call]
        norm = self.engine.get_global_grad_norm()  # the engine clipped with gradient_clipping
        return torch.tensor(float(norm)) if norm is not None else None

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        if self.engine is None:
            return super()._get_grad_norm(model, grad_norm)  # type: ignore[no-untyped-call]
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else None

    # -- saving ----------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """A normal Transformers checkpoint directory (``from_pretrained`` loads it). Every rank
        must call it: under ZeRO-3 the weights are gathered one parameter at a time."""
        if self.engine is None:
            return super().save_model(output_dir, _internal_call)
        output_dir = output_dir or self.args.output_dir
        state_dict = provided("consolidated_state_dict")(self.engine)
        if self.args.should_save:
            self._save(output_dir, state_dict=state_dict)
        self.accelerator.wait_for_everyone()

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self.engine is not None:
            # Sharded weights, optimizer state and counters for resuming, beside the HF files.
            self.engine.save_checkpoint(os.path.join(output_dir, "ds_engine"), tag="checkpoint")
        super()._save_optimizer_and_scheduler(output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if self.engine is not None and checkpoint is not None:
            path = os.path.join(checkpoint, "ds_engine")
            if os.path.isdir(path):
                self.engine.load_checkpoint(path, tag="checkpoint")
        super()._load_optimizer_and_scheduler(checkpoint)
