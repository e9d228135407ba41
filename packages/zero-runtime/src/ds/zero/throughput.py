"""``engine.tput_timer``: training samples per second, under DeepSpeed's names and counting.

The engine starts the timer at each forward and stops it at each ``step()``, telling it whether
the step ended an accumulation window (a global step). Global steps before ``start_step`` are
counted but not timed (warm-up); after them each forward-to-step interval adds to
``total_elapsed_time`` and ``avg_samples_per_sec()`` divides the samples of the timed global
steps by it. ``timers.throughput.enabled: false`` turns it off. ``synchronized: true``, when the
config sets it, waits for the accelerator once per optimizer step (when a window ends) rather than
at every micro-step: the window's last interval then also holds the device work its earlier
micro-steps queued. Left unset, the timer waits for nothing (DeepSpeed's default is to wait): a
host sync at every step would cost every run on an asynchronous device for a number most runs
never read, and the host-side intervals still give samples per second once the queue is full.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ds.interfaces.logging import get_logger

log = get_logger(__name__)


class ThroughputTimer:
    def __init__(
        self,
        batch_size: int | None,
        *,
        enabled: bool = True,
        synchronize: Callable[[], None] | None = None,
        start_step: int = 2,
        steps_per_output: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``batch_size``: samples per global step (the train batch size); ``synchronize``: the
        accelerator's, called at a window's end (None: nothing to wait for);
        ``steps_per_output``: log the rate every that many global steps (None: never);
        ``clock``: seconds, as ``time.time``."""
        self.enabled = enabled
        self.clock = clock
        self.synchronize = synchronize
        self.batch_size = 1 if batch_size is None else batch_size
        self.start_step = start_step
        self.steps_per_output = steps_per_output
        self.initialized = False  # a start() was seen
        self.started = False
        self.start_time = 0.0
        self.end_time = 0.0
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0
        self.step_elapsed_time = 0.0  # of the current window

    def update_epoch_count(self) -> None:
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self) -> None:
        if not self.enabled:
            return
        self.initialized = self.started = True
        if self.global_step_count >= self.start_step:
            self.start_time = self.clock()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        """End the interval a start() began (nothing when none is running)."""
        if not self.enabled or not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time <= 0:
            return  # warm-up: counted, not timed
        if global_step and self.synchronize is not None:
            self.synchronize()
        self.end_time = self.clock()
        duration = self.end_time - self.start_time
        self.total_elapsed_time += duration
        self.step_elapsed_time += duration
        if not global_step:
            return
        if (
            report_speed
            and self.steps_per_output
            and self.global_step_count % self.steps_per_output == 0
        ):
            log.info(
                "throughput",
                epoch=self.epoch_count,
                micro_step=self.micro_step_count,
                global_step=self.global_step_count,
                avg_samples_per_sec=self.avg_samples_per_sec(),
                samples_per_sec=self.batch_size / max(self.step_elapsed_time, 1e-12),
            )
        self.step_elapsed_time = 0.0

    def avg_samples_per_sec(self) -> float:
        """Samples per second over the timed global steps; ``-inf`` before there is one."""
        timed = self.global_step_count - self.start_step
        if timed <= 0 or self.total_elapsed_time <= 0:
            return float("-inf")
        return self.batch_size / (self.total_elapsed_time / timed)


def for_engine(engine: Any) -> ThroughputTimer:
    """The timer of ``engine``, from its ``timers.throughput`` section."""
    section = engine.ds_config.timers
    enabled = section.throughput.enabled if section is not None else True
    # Only an explicit "synchronized": true buys the per-step host sync (see the module doc).
    tput = section.throughput if section is not None else None
    synchronized = (
        tput is not None and "synchronized" in tput.model_fields_set and tput.synchronized
    )
    acc = engine.accelerator
    waits = acc is not None and not acc.capabilities().is_synchronized_device
    return ThroughputTimer(
        engine.config.train_batch_size,
        enabled=enabled,
        synchronize=acc.synchronize if synchronized and waits else None,
    )


__all__ = ["ThroughputTimer", "for_engine"]
