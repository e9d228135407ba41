"""``deepspeed.monitor.comet.CometMonitor``: DeepSpeed's constructor over ``ds.monitor.comet.CometMonitor``."""

from ds.full.compat.deepspeed.monitor.monitor import Monitor
from ds.monitor.comet import CometMonitor as _Ds


class CometMonitor(Monitor, _Ds):
    pass


__all__ = ["CometMonitor"]
