"""``torch.optim.Optimizer`` classes backed by the native fused CPU kernels.

Constructor arguments follow DeepSpeed's CPU optimizers (``DeepSpeedCPUAdam``,
``DeepSpeedCPUAdagrad``, ``DeepSpeedCPULion``), so switching is a change of import.
:class:`SelectiveAdamW` / :class:`SelectiveAdamWPartitioned` (ZenFlow's update of a parameter's
selected columns) run in torch on any device.
"""

from ds.ops.optim.adagrad import CPUAdagrad
from ds.ops.optim.adam import CPUAdam
from ds.ops.optim.lion import CPULion
from ds.ops.optim.selective_adamw import SelectiveAdamW, SelectiveAdamWPartitioned

__all__ = [
    "CPUAdagrad",
    "CPUAdam",
    "CPULion",
    "SelectiveAdamW",
    "SelectiveAdamWPartitioned",
]
