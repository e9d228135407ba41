import pytest
import torch

from ds.accel.mps import MpsAccelerator
from ds.interfaces.accelerator import Accelerator


def test_mps_class_implements_protocol():
    acc = MpsAccelerator()
    assert isinstance(acc, Accelerator)
    assert acc.communication_backend_name() == "gloo"
    assert acc.device_count() == (1 if acc.is_available() else 0)


@pytest.mark.skipif(
    not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
    reason="needs Apple silicon with MPS; this machine has none",
)
def test_mps_device_roundtrip():
    acc = MpsAccelerator()
    x = torch.ones(8, device=acc.device())
    acc.synchronize()
    assert acc.memory_allocated() > 0 and float(x.sum()) == 8
