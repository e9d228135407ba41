"""``deepspeed.monitor.wandb.WandbMonitor``: DeepSpeed's constructor over ``ds.monitor.wandb.WandbMonitor``."""

from ds.full.compat.deepspeed.monitor.monitor import Monitor
from ds.monitor.wandb import WandbMonitor as _Ds


class WandbMonitor(Monitor, _Ds):
    pass


__all__ = ["WandbMonitor"]
