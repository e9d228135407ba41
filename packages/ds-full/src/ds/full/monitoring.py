"""Monitors and the flops profiler of a training run, wired from the config's DeepSpeed blocks.

``tensorboard``, ``wandb``, ``comet`` and ``csv_monitor`` come from ds-monitor through the
``ds.monitors`` registry group; ``flops_profiler`` profiles the forward of ``profile_step`` and
prints (or writes ``output_file``) on rank 0. MFU in the step metrics uses the dense rule of
6 FLOPs per trainable parameter per token (forward 2, backward 4) against the accelerator's peak.
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.logging import get_logger
from ds.interfaces.telemetry import StepMetrics

log = get_logger(__name__)

_BLOCKS = ("tensorboard", "wandb", "comet", "csv_monitor", "flops_profiler")


def _import_monitor() -> Any:
    try:
        import ds.monitor.hub as hub
    except ImportError:
        raise ConfigError(
            "the config enables a monitor or the flops profiler, which ds-monitor provides; "
            "install it with: pip install ds-monitor"
        ) from None
    return hub


def _enabled(section: Any) -> bool:
    return isinstance(section, Mapping) and bool(section.get("enabled", False))


def attach_monitors(engine: Any, config: Mapping[str, Any]) -> Any:
    """Build and attach the run's monitors; returns the hub (``None`` without monitors)."""
    import os

    if not any(_enabled(config.get(b)) for b in _BLOCKS) and not os.environ.get("DS_MONITORS"):
        return None
    hub_mod = _import_monitor()
    from ds.monitor.peak import peak_flops

    params = [p for p in engine.module.parameters() if p.requires_grad]
    first = params[0] if params else None
    peak = peak_flops(first.device, first.dtype) if first is not None else None
    hub = hub_mod.MonitorHub.from_config(
        config,
        rank=engine.rank,
        flops_per_token=6.0 * sum(p.numel() for p in params),
        peak_flops=peak * engine.world_size if peak else None,
        wall_clock_breakdown=bool(config.get("wall_clock_breakdown", False)),
    )
    if hub is not None:
        hub.attach(engine.events)
        atexit.register(hub.close)
    profiler_cfg = config.get("flops_profiler")
    if _enabled(profiler_cfg):
        _attach_profiler(engine, dict(profiler_cfg))
    return hub


def _attach_profiler(engine: Any, cfg: dict[str, Any]) -> None:
    from ds.monitor.flops import FlopsProfiler, format_profile
    from ds.monitor.peak import peak_flops

    step = int(cfg.get("profile_step", 1))
    if step < 1:
        raise ConfigError(f"flops_profiler.profile_step = {step}: must be >= 1 (a step number)")
    prof = FlopsProfiler(engine.module, recompute_fwd_factor=cfg.get("recompute_fwd_factor", 0.0))
    state = {"done": False, "last": engine.global_steps}
    if engine.global_steps + 1 == step:
        prof.start_profile()

    def on_step(m: StepMetrics) -> None:
        state["last"] = m.step
        if m.step == step - 1:
            prof.start_profile()
        elif m.step == step and prof.started:
            prof.stop_profile()
            state["done"] = True
            if engine.rank == 0:
                p = next(engine.module.parameters(), torch.empty(0))
                text = format_profile(
                    prof,
                    profile_step=step,
                    module_depth=int(cfg.get("module_depth", -1)),
                    top_modules=int(cfg.get("top_modules", 1)),
                    detailed=bool(cfg.get("detailed", True)),
                    peak_flops=peak_flops(p.device, p.dtype),
                )
                out = cfg.get("output_file")
                if out:
                    with open(out, "w") as f:
                        f.write(text + "\n")
                else:
                    print(text, flush=True)

    def never_reached() -> None:
        if not state["done"] and engine.rank == 0:
            log.warning(
                f"flops_profiler.profile_step = {step} was never reached: the run ended at step "
                f"{state['last']}; set profile_step to a step the run takes"
            )

    engine.events.subscribe(on_step, StepMetrics)
    engine.flops_profiler = prof
    atexit.register(never_reached)
