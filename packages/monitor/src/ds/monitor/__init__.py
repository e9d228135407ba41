"""Training monitors and the flops profiler.

Monitors are sinks for an engine's step telemetry, one per DeepSpeed config block
(``tensorboard``, ``wandb``, ``comet``, ``csv_monitor``), registered under the ``ds.monitors``
entry-point group so the composition root builds them from the config. They write DeepSpeed's
event names (``Train/Samples/train_loss``, ``Train/Samples/lr``, ...) at DeepSpeed's x axis (global
samples), plus ds's own step metrics (see :mod:`ds.monitor.events`).
"""

from __future__ import annotations

from ds.monitor.base import Monitor, MonitorEvent
from ds.monitor.events import step_events
from ds.monitor.hub import MonitorHub

__all__ = ["Monitor", "MonitorEvent", "MonitorHub", "step_events"]
