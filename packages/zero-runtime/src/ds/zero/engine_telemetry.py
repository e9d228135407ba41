"""The engine's step telemetry: the window's loss kept on the device and staged to the host
ahead of the step's one sync, tokens counted from metadata, and the :class:`StepMetrics` each
optimizer step publishes (monitors, the gate and the ledger subscribe to them)."""

from __future__ import annotations

import resource
import time
from typing import Any

import torch

from ds.interfaces.accelerator import Accelerator
from ds.interfaces.logging import get_logger
from ds.interfaces.telemetry import StepMetrics

log = get_logger(__name__)


class StepTelemetry:
    """What one accumulation window measured, until the step publishes it."""

    def __init__(self, accelerator: Accelerator | None) -> None:
        self.accelerator = accelerator
        self.window_tokens = 0
        # The window's summed loss stays a tensor on the loss's device (no host sync per
        # micro-step); ``stage_loss`` makes one host copy of it per step.
        self.loss_sum: torch.Tensor | None = None
        self.loss_count = 0
        self._loss_host: tuple[torch.Tensor, Any] | None = None
        self.last_step_end = time.perf_counter()

    def count_tokens(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.window_tokens += token_count(args, kwargs)

    def add_loss(self, loss: torch.Tensor) -> None:
        value = loss.detach().float().sum()
        self.loss_sum = value if self.loss_sum is None else self.loss_sum + value
        self.loss_count += 1

    def set_window_loss(self, loss: torch.Tensor) -> None:
        """The window's loss as one value (a pipeline's batch mean), replacing the micro-steps'."""
        self.loss_sum, self.loss_count = loss, 1

    def stage_loss(self) -> None:
        """Start the copy of the window's loss to the host, ahead of the step's one sync (the
        norm's read-back in ``prepare_step``), so reading it in ``publish`` waits for nothing
        more: an event marks the copy where the device has events; without them the copy
        is a plain (synchronous) one."""
        total, self.loss_sum = self.loss_sum, None
        count, self.loss_count = self.loss_count, 0
        if total is None:
            self._loss_host = None
            return
        total = total / count
        event = None
        acc = self.accelerator
        caps = acc.capabilities() if acc is not None else None
        if total.device.type != "cpu" and caps is not None and caps.has_events:
            host = total.to("cpu", non_blocking=True)
            event = acc.new_event()  # type: ignore[union-attr]
            event.record()
        else:
            host = total.to("cpu")
        self._loss_host = (host, event)

    def take_loss(self) -> float | None:
        staged, self._loss_host = self._loss_host, None
        if staged is None:
            return None
        host, event = staged
        if event is not None and not event.query():
            # Normally complete: the copy was queued before the step's one sync point (the
            # norm's read-back). Only a step without that sync waits here.
            event.synchronize()
        return float(host.tolist())  # a host tensor: no device read-back

    def metrics(
        self, engine: Any, overflow: bool, grad_norm: float | None, samples: int
    ) -> StepMetrics:
        """The step's metrics (the window's counters start over); ``samples``: what the window
        trained on, over the data-parallel ranks."""
        now = time.perf_counter()
        times = engine.timers.take()
        metrics = StepMetrics(
            step=engine.global_steps,
            loss=self.take_loss(),
            lr=engine.get_lr()[0] if engine.optimizer.param_groups else 0.0,
            step_time_s=now - self.last_step_end,
            forward_s=times.get("forward", 0.0),
            backward_s=times.get("backward", 0.0),
            optimizer_s=times.get("step", 0.0),
            comm_s=engine.comm_stats.take(),
            peak_host_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            grad_norm=grad_norm,
            overflow=overflow,
            loss_scale=engine.loss_scaler.loss_scale if engine.fp16_enabled() else None,
            samples=samples,
            global_samples=engine.global_samples,
            tokens=self.window_tokens * engine.world_size,
            rank=engine.rank,
            world_size=engine.world_size,
            **engine._step_extras(),
        )
        self.last_step_end = now
        self.window_tokens = 0
        return metrics


def log_step(engine: Any, metrics: StepMetrics) -> None:
    """The ``train step`` line rank 0 prints every ``steps_per_print`` steps."""
    every = engine.ds_config.steps_per_print
    if engine.rank != 0 or not every or engine.global_steps % every != 0:
        return
    fields: dict[str, Any] = {
        "step": engine.global_steps,
        "loss": None if metrics.loss is None else round(metrics.loss, 6),
        "lr": metrics.lr,
        "skipped": engine.skipped_steps,
    }
    if engine.ds_config.wall_clock_breakdown:
        fields.update(
            forward_ms=round(metrics.forward_s * 1e3, 2),
            backward_ms=round(metrics.backward_s * 1e3, 2),
            step_ms=round(metrics.optimizer_s * 1e3, 2),
            comm_ms=round(metrics.comm_s * 1e3, 2),
        )
    log.info("train step", **fields)


def token_count(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Tokens in a micro-batch: the ``input_ids`` (or first integer tensor argument) element
    count; 0 when the model takes no token ids. Metadata only, no device sync."""
    ids = kwargs.get("input_ids")
    if ids is None and args and isinstance(args[0], torch.Tensor):
        ids = args[0]
    if isinstance(ids, torch.Tensor) and not ids.is_floating_point() and not ids.is_complex():
        return ids.numel()
    return 0
