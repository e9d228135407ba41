"""The pipeline half of the pipeline engine: DeepSpeed's ``train_batch`` / ``eval_batch`` over a
pipeline of stages, the bubble measurement and the per-layer checkpoints.

:class:`PipelineTraining` is a mix-in over a training engine (ZeRO stage 0/1 within each stage:
ds.full composes it with ``ds.zero``'s engine, which this package does not import). It runs every
micro-batch's backward with the engine's reduction held back, sums the tied weights' gradients
over their stages, then lets the engine reduce once at the boundary and step; the global gradient
norm adds the stages' squares over the mesh's "pp" group. What it uses of the engine: ``config``,
``comm``, ``mesh``, ``device``, ``module``, ``strategy`` (``begin_micro_step``, ``end_backward``,
``grad_buffer``, ``groups``, ``synchronize_parameters``), ``loss_scaler``, ``lr_scheduler``,
``timers``, ``telemetry``, the step counters and ``step()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from ds.interfaces.errors import ConfigError

#: Where the pipeline keys live in a DeepSpeed config: ``{"pipeline": {"stages": 2, ...}}``.
DEFAULT_SCHEDULE = "1f1b"


def is_pipeline(model: Any) -> bool:
    from ds.parallel.pipeline import PipelineModule

    return isinstance(model, PipelineModule)


def _section(cfg: Any) -> dict[str, Any]:
    return dict(cfg.pipeline or {})


def settings(cfg: Any, model: Any) -> tuple[int, str]:
    """``(stages, schedule)`` from ``pipeline.stages`` / the module's ``num_stages`` and
    ``pipeline.schedule``."""
    from ds.parallel.pipeline import SCHEDULES

    section = _section(cfg)
    want = section.get("stages", "auto")
    have = model.num_stages
    if want in (None, "auto"):
        if have is None:
            raise ConfigError(
                "the PipelineModule has no num_stages and the config no pipeline.stages; set "
                "one of them"
            )
        stages = int(have)
    else:
        stages = int(want)
        if have is not None and int(have) != stages:
            raise ConfigError(
                f"pipeline.stages={stages} but PipelineModule(num_stages={have}); make them agree "
                "or set pipeline.stages to 'auto'"
            )
    schedule = str(section.get("schedule", DEFAULT_SCHEDULE)).lower()
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"pipeline.schedule={schedule!r} is not known; use one of {', '.join(SCHEDULES)}"
        )
    stage = cfg.zero_optimization.stage
    if stage >= 2:
        raise ConfigError(
            f"zero_optimization.stage={stage} with pipeline parallelism: ZeRO-2/3 partition the "
            "gradients a pipeline accumulates over its micro-batches; use stage 0 or 1 (as "
            "DeepSpeed requires)"
        )
    return stages, schedule


def apply_checkpointing(cfg: Any, model: Any) -> None:
    """The config's ``pipeline.activation_checkpoint_interval`` (above 0, it replaces the
    module's) and ``pipeline.use_reentrant``: ``false`` drops the module's checkpoint function
    for ds's non-reentrant default, whatever the interval is now (``set_checkpoint_interval``
    may turn checkpointing on later); ``true``, DeepSpeed's default, keeps the module's."""
    section = _section(cfg)
    interval = section.get("activation_checkpoint_interval", 0)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
        raise ConfigError(
            f"pipeline.activation_checkpoint_interval={interval!r}: use a whole number of layers "
            "per checkpointed segment, or 0 to keep the PipelineModule's own"
        )
    reentrant = section.get("use_reentrant")
    if reentrant is not None and not isinstance(reentrant, bool):
        raise ConfigError(f"pipeline.use_reentrant={reentrant!r}: use true or false")
    if reentrant is False:
        model.activation_checkpoint_func = None
    if interval > 0:
        model.set_checkpoint_interval(interval)


def check_stage_tp(world: int, stages: int, tp: int) -> None:
    """The TP size must divide each stage's ranks (``world / stages``)."""
    per_stage = world // stages
    if per_stage % tp:
        raise ConfigError(
            f"tensor_parallel.autotp_size={tp} does not divide the {per_stage} ranks of each "
            f"pipeline stage (world {world} / pipeline.stages {stages}); choose an autotp_size "
            f"dividing {per_stage} or launch {stages * tp} x k ranks"
        )


class PipelineTraining:
    """``train_batch`` / ``eval_batch`` over a pipeline of stages (a mix-in: see the module)."""

    # The schedule owns the accumulation window (DeepSpeed's engine attribute name; ds.zero's
    # engine refuses what needs a caller-owned window when it is set).
    pipeline_parallelism = True
    num_stages: int
    schedule_name: str

    def _pipeline_setup(self, model: Any, cfg: Any, mesh: Any, comm: Any) -> None:
        """Before the engine's own setup: the stage count and schedule, and the tied weights'
        groups (collective: every rank, before anything else talks)."""
        from ds.parallel.pipeline import TiedWeights

        self.num_stages, self.schedule_name = settings(cfg, model)
        apply_checkpointing(cfg, model)
        if self.num_stages > 1 and mesh is None:
            raise ConfigError(
                "a pipeline of several stages needs mesh=; build it with ds.initialize"
            )
        self.tied = None
        if mesh is not None:
            self.tied = TiedWeights(model, comm, mesh.shape, mesh.rank)
        if self.schedule_name == "interleaved_1f1b" and model.num_virtual_stages < 2:
            raise ConfigError(
                "pipeline.schedule='interleaved_1f1b' needs chunks per stage: build the "
                "PipelineModule with num_virtual_stages=2 (or more)"
            )

    def _pipeline_bind(self, model: Any) -> None:
        """After the engine's setup: this rank's stage, its runner and the tied weights' values."""
        from ds.parallel.pipeline import PipelineRunner

        if self.tied is not None:
            self.tied.broadcast()
        if self.mesh is not None:
            # The world rank, not the rank inside the stage: one rank (the world's first) logs,
            # records the run in the ledger and writes the exported model.
            self.rank = int(self.mesh.rank)
        self.stage_id = int(model.stage_id)
        self.chunks = int(model.num_virtual_stages)
        self.pp_ranks = self.mesh.ranks("pp") if self.mesh is not None else (0,)
        self.runner = PipelineRunner(
            model, self.comm, self.pp_ranks, self.device, accelerator=self.accelerator
        )
        self._data: Iterator[Any] | None = None
        self._pipe_extras: dict[str, Any] = {}
        self.last_step_times: Any = None

    # -- DeepSpeed's PipelineEngine surface ------------------------------------------------------
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError("a pipeline engine runs whole batches: call engine.train_batch()")

    def backward(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError("a pipeline engine runs whole batches: call engine.train_batch()")

    def _microbatches(self, data_iter: Any) -> list[tuple[Any, Any]]:
        if data_iter is None:
            if self.training_dataloader is None:
                raise ConfigError("train_batch() needs data_iter= or initialize(training_data=...)")
            if self._data is None:
                self._data = iter(self.training_dataloader)
            data_iter = self._data
        out = []
        for _ in range(self.config.gradient_accumulation_steps):
            item = next(data_iter)
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ConfigError(
                    "a pipeline's data iterator yields (inputs, labels) pairs, got "
                    f"{type(item).__name__}"
                )
            out.append((item[0], item[1]))
        return out

    def _schedule(self, microbatches: int, train: bool) -> list[Any]:
        from ds.parallel.pipeline import build, forward_only

        actions = build(
            self.schedule_name,
            self.num_stages,
            microbatches,
            self.stage_id,
            self.chunks,
        )
        return actions if train else forward_only(actions)

    def _mean_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The batch's mean loss, on every rank: the last stage's micro-batch mean, averaged over
        the data-parallel ranks and broadcast down the pipeline."""
        if losses:
            value = torch.stack([t.float() for t in losses]).mean()
        else:
            value = torch.zeros((), device=self.device)
        value = value.detach().clone().to(self.device)
        if self.comm is not None and self.mesh is not None:
            if self.mesh.shape.dp > 1:
                self.comm.all_reduce(value, group=self.mesh.group("dp"))
                value /= self.mesh.shape.dp
            if self.num_stages > 1:
                self.comm.broadcast(value, src=self.pp_ranks[-1], group=self.mesh.group("pp"))
        return value

    def train_batch(self, data_iter: Any = None) -> torch.Tensor:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches; returns the
        batch's mean loss on every rank."""
        gas = self.config.gradient_accumulation_steps
        microbatches = self._microbatches(data_iter)
        actions = self._schedule(gas, train=True)
        self.module.train()
        self.timers.start("backward")
        # Every backward accumulates locally; ZeRO reduces once, after the tied sum.
        self.strategy.begin_micro_step(False, False)
        times = self.runner.run(actions, microbatches, loss_scale=self.loss_scaler.loss_scale / gas)
        if self.tied is not None:
            buffer = getattr(self.strategy, "grad_buffer", None)
            self.tied.all_reduce_grads(lambda p: buffer(p) if buffer else p.grad)
        self.strategy.begin_micro_step(True, False)
        self.strategy.end_backward()
        self.timers.stop("backward")
        loss = self._mean_loss(times.losses)
        self.telemetry.set_window_loss(loss)
        self._pipe_extras = self._bubble(times, gas)
        self.last_step_times = times
        # The window is complete: the engine's boundary falls on this step.
        self.micro_steps = (self.micro_steps // gas + 1) * gas - 1
        super().step()
        return loss

    def eval_batch(
        self, data_iter: Any = None, return_logits: bool = False, compute_loss: bool = True,
        reduce_output: str | None = "avg",
    ) -> torch.Tensor:  # fmt: skip
        """The mean loss of ``gradient_accumulation_steps`` micro-batches, without gradients."""
        if return_logits or not compute_loss:
            raise ConfigError(
                "eval_batch(return_logits=True / compute_loss=False) is not available in ds; "
                "call it with the defaults (it returns the mean loss)"
            )
        gas = self.config.gradient_accumulation_steps
        microbatches = self._microbatches(data_iter)
        self.module.eval()
        with torch.no_grad():
            times = self.runner.run(self._schedule(gas, train=False), microbatches)
        self.module.train()
        return self._mean_loss(times.losses)

    def _bubble(self, times: Any, microbatches: int) -> dict[str, Any]:
        from ds.parallel.pipeline import bubble_fraction

        formula = bubble_fraction(self.num_stages, microbatches, self.chunks)
        mine = torch.tensor([times.compute_s, times.total_s], dtype=torch.float64)
        if self.comm is not None and self.num_stages > 1 and self.mesh is not None:
            parts = [torch.zeros_like(mine, device=self.device) for _ in range(self.num_stages)]
            self.comm.all_gather(parts, mine.to(self.device), group=self.mesh.group("pp"))
            rows = [p.cpu() for p in parts]
        else:
            rows = [mine]
        compute = tuple(float(r[0]) for r in rows)
        span = max(float(r[1]) for r in rows)
        measured = 1.0 - sum(compute) / (len(rows) * span) if span > 0 else 0.0
        return {
            "pipeline_bubble_fraction": measured,
            "pipeline_bubble_formula": formula,
            "stage_compute_s": compute,
        }

    def _step_extras(self) -> dict[str, Any]:
        extras, self._pipe_extras = self._pipe_extras, {}
        return extras

    # -- checkpoints: one file per layer, any pipeline size loads them --------------------------
    def save_checkpoint(
        self,
        save_dir: str,
        tag: str | None = None,
        client_state: dict[str, Any] | None = None,
        *,
        exclude_frozen_parameters: bool = False,
    ) -> None:
        from ds.parallel.pipeline.checkpoint import save

        if exclude_frozen_parameters:
            raise ConfigError(
                "save_checkpoint(exclude_frozen_parameters=True) is not available for pipeline "
                "checkpoints; save every layer (the default)"
            )

        save(self, save_dir, tag or f"global_step{self.global_steps}", client_state)

    def load_checkpoint(self, load_dir: str, tag: str | None = None, **kwargs: Any) -> Any:
        from ds.parallel.pipeline.checkpoint import load

        return load(self, load_dir, tag, **kwargs)

    def save_16bit_model(self, save_dir: str, save_filename: str = "pytorch_model.bin") -> bool:
        from ds.parallel.pipeline.checkpoint import full_state_dict

        weights = full_state_dict(self)
        if self.comm is None or self.comm.get_rank() == 0:
            os.makedirs(save_dir, exist_ok=True)
            torch.save(weights, os.path.join(save_dir, save_filename))
        return True


__all__ = ["DEFAULT_SCHEDULE", "PipelineTraining", "check_stage_tp", "is_pipeline", "settings"]
