"""The monitors of one run: built from the config blocks, fed from the engine's event bus.

DeepSpeed writes from rank 0 only; so does ds unless ``all_ranks`` (``DS_MONITOR_ALL_RANKS=1``)
asks every rank to write, each into its own ``rank<r>`` directory. Third-party monitors registered
under ``ds.monitors`` are enabled by naming them in ``DS_MONITORS`` (comma-separated); their config
block, if any, is the top-level key of the same name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ds.interfaces import registry
from ds.interfaces.errors import ConfigError
from ds.interfaces.telemetry import EventBus, StepMetrics
from ds.monitor.base import Monitor
from ds.monitor.events import step_events

# DeepSpeed's monitor blocks, in the order its MonitorMaster writes them.
BLOCKS = ("tensorboard", "wandb", "csv_monitor", "comet")


def _enabled(section: Any) -> bool:
    return isinstance(section, Mapping) and bool(section.get("enabled", False))


def requested(config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> list[str]:
    """The monitor names a config (and ``DS_MONITORS``) turns on, unknown names refused."""
    env = os.environ if env is None else env
    names = [b for b in BLOCKS if _enabled(config.get(b))]
    extra = [n.strip() for n in env.get("DS_MONITORS", "").split(",") if n.strip()]
    known = set(registry.list_providers(registry.MONITORS))
    for name in extra:
        if name not in known:
            raise ConfigError(
                f"DS_MONITORS names an unknown monitor '{name}'; registered monitors: "
                f"{', '.join(sorted(known)) or 'none'} (install the distribution that provides it)"
            )
        if name not in names:
            names.append(name)
    return names


@dataclass(eq=False)
class MonitorHub:
    """Fans one engine's step metrics out to its monitors as DeepSpeed-named events."""

    monitors: Sequence[Monitor]
    _: KW_ONLY
    rank: int = 0
    all_ranks: bool = False
    flops_per_token: float | None = None
    peak_flops: float | None = None
    wall_clock_breakdown: bool = False
    global_samples: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.monitors = list(self.monitors)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        rank: int,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> MonitorHub | None:
        """Build every monitor the config enables on this rank; ``None`` when none is."""
        env = os.environ if env is None else env
        names = requested(config, env)
        if not names:
            return None
        all_ranks = env.get("DS_MONITOR_ALL_RANKS", "") not in ("", "0", "false")
        if rank != 0 and not all_ranks:
            return cls([], rank=rank, **kwargs)
        monitors = []
        for name in names:
            factory = registry.get(registry.MONITORS, name)
            section = config.get(name) or {}
            monitors.append(factory(section, rank=rank, per_rank=all_ranks))
        return cls(monitors, rank=rank, all_ranks=all_ranks, **kwargs)

    def attach(self, bus: EventBus) -> None:
        bus.subscribe(self.on_step, StepMetrics)

    def on_step(self, m: StepMetrics) -> None:
        # The engine's count survives a resume; a publisher that does not set it is counted here.
        self.global_samples = m.global_samples or self.global_samples + m.samples
        if not self.monitors:
            return
        events = step_events(
            m,
            self.global_samples,
            flops_per_token=self.flops_per_token,
            peak_flops=self.peak_flops,
            wall_clock_breakdown=self.wall_clock_breakdown,
        )
        for monitor in self.monitors:
            monitor.write_events(events)

    def close(self) -> None:
        for monitor in self.monitors:
            monitor.close()
