"""``deepspeed.monitor.csv_monitor.csvMonitor``: DeepSpeed's constructor over ``ds.monitor.csv.CsvMonitor``."""

from ds.full.compat.deepspeed.monitor.monitor import Monitor
from ds.monitor.csv import CsvMonitor as _Ds


class csvMonitor(Monitor, _Ds):
    pass


__all__ = ["csvMonitor"]
