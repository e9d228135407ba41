"""Step telemetry as monitor events.

DeepSpeed's engine logs ``Train/Samples/train_loss``, ``Train/Samples/lr`` and, with fp16,
``Train/Samples/loss_scale``, and with ``wall_clock_breakdown`` the
``Train/Samples/elapsed_time_ms_{forward,backward,step}`` timings, all against the global sample
count. ds writes the same names at the same x, then its own step metrics under the same prefix:
step time, samples/s, tokens/s, MFU, peak memory, the share of the step spent in collectives and
the gradient norm.
"""

from __future__ import annotations

from ds.interfaces.telemetry import StepMetrics
from ds.monitor.base import MonitorEvent

PREFIX = "Train/Samples/"


def step_events(
    m: StepMetrics,
    global_samples: int,
    *,
    flops_per_token: float | None = None,
    peak_flops: float | None = None,
    wall_clock_breakdown: bool = False,
) -> list[MonitorEvent]:
    """The events of one optimizer step. ``flops_per_token`` (training FLOPs, forward and
    backward, per token) and ``peak_flops`` (the whole job's peak, FLOP/s) give MFU."""
    x = global_samples
    out: list[MonitorEvent] = []

    def add(name: str, value: float | int | None) -> None:
        if value is not None:
            out.append((PREFIX + name, float(value), x))

    add("train_loss", m.loss)
    add("lr", m.lr)
    add("loss_scale", m.loss_scale)
    if wall_clock_breakdown:
        add("elapsed_time_ms_forward", m.forward_s * 1e3)
        add("elapsed_time_ms_backward", m.backward_s * 1e3)
        add("elapsed_time_ms_step", m.optimizer_s * 1e3)
    step_s = m.step_time_s if m.step_time_s > 0 else None
    add("step_time_s", step_s)
    if step_s:
        add("samples_per_s", m.samples / step_s)
        tokens = getattr(m, "tokens", 0)
        if tokens:
            add("tokens_per_s", tokens / step_s)
            if flops_per_token and peak_flops:
                add("mfu", tokens * flops_per_token / step_s / peak_flops)
        add("comm_share", min(1.0, m.comm_s / step_s))
    add("grad_norm", m.grad_norm)
    if m.peak_device_bytes:
        add("peak_device_bytes", m.peak_device_bytes)
    if m.peak_host_rss_bytes:
        add("peak_host_rss_bytes", m.peak_host_rss_bytes)
    return out
