"""The CUDA path. Runs on a machine with a CUDA device; skipped with the reason elsewhere."""

import pytest
import torch

from ds.accel.cuda import CudaAccelerator
from ds.interfaces.accelerator import Accelerator


def test_cuda_class_implements_protocol_and_reports_absence_honestly():
    acc = CudaAccelerator()
    assert isinstance(acc, Accelerator)
    assert acc.is_available() == torch.cuda.is_available()
    assert acc.communication_backend_name() == "nccl"
    env: dict[str, str] = {}
    acc.set_visible_devices_envs(env, [0, 1])
    assert env[acc.visible_devices_envs()[0]] == "0,1"


def test_set_device_past_the_visible_devices_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from ds.interfaces.errors import AcceleratorError

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    acc = CudaAccelerator()
    count = acc.device_count()
    with pytest.raises(AcceleratorError, match=rf"cuda device {count} does not exist: {count} dev"):
        acc.set_device(count)


@pytest.mark.gpu
def test_cuda_device_memory_streams_rng():
    acc = CudaAccelerator()
    acc.set_device(0)
    acc.reset_peak_memory_stats()
    x = torch.ones(1 << 20, device=acc.device(0))
    assert acc.memory_allocated() >= x.numel() * 4
    s = acc.new_stream()
    start, end = acc.new_event(enable_timing=True), acc.new_event(enable_timing=True)
    with acc.stream(s):
        start.record()
        y = x * 2
        end.record()
    acc.synchronize()
    assert start.elapsed_time(end) >= 0 and float(y.sum()) == 2 * x.numel()
    acc.manual_seed(1)
    st = acc.get_rng_state()
    a = torch.rand(3, device="cuda")
    acc.set_rng_state(st)
    assert torch.equal(a, torch.rand(3, device="cuda"))
    p = acc.pin_memory(torch.zeros(4))
    assert acc.is_pinned(p)
