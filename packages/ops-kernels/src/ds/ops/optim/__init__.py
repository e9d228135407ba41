"""``torch.optim.Optimizer`` classes backed by the native fused CPU kernels.

Constructor arguments follow DeepSpeed's CPU optimizers (``DeepSpeedCPUAdam``,
``DeepSpeedCPUAdagrad``, ``DeepSpeedCPULion``), so switching is a change of import.
"""

from ds.ops.optim.adagrad import CPUAdagrad
from ds.ops.optim.adam import CPUAdam
from ds.ops.optim.lion import CPULion

__all__ = ["CPUAdagrad", "CPUAdam", "CPULion"]
