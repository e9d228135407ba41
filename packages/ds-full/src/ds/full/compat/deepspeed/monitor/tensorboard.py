"""``deepspeed.monitor.tensorboard.TensorBoardMonitor``: DeepSpeed's constructor over ``ds.monitor.tensorboard.TensorBoardMonitor``."""

from ds.full.compat.deepspeed.monitor.monitor import Monitor
from ds.monitor.tensorboard import TensorBoardMonitor as _Ds


class TensorBoardMonitor(Monitor, _Ds):
    pass


__all__ = ["TensorBoardMonitor"]
